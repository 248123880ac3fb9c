"""Lanes: calls to a broker actor on the caller's own node over a Unix socket instead of Ray.

Why (a change to "clients talk to the actors through handles", as the shape asks to say): a Ray
actor call costs about 1.2-2.7 ms round trip on the two-core machines raybus is measured on, a
call over a Unix socket between the same two processes about 0.1 ms (``benchmarks/RESULTS.md``,
assessment; ``benchmarks/lanes.py`` measures the broker with lanes on and off).
A sender that awaits each message, a receiver's long poll answered by one send, a settlement:
each is one call, and the call was most of their time and of the partition's CPU.

What stays the same. The handle is still how a client finds an actor, and the call is the same
method of the same actor with the same arguments (the access token included), run on the
actor's event loop as Ray would run it: a lane is another wire for the same call, not another
interface. Only the hot path's methods are served, those marked ``guarded(..., lane=True)``
(``raybus._actors.access``: sends, publishes, receives, peeks, settlements, locks, sessions):
their arguments and answers are plain data. Methods that pass actor handles or object
references along (transactions, partition moves, routes) keep Ray's calls, which track them.
Requests on one lane start in the order sent, as Ray starts one caller's calls in order. A call
whose caller stops waiting runs on, as with Ray. The errors are Ray's path's errors: a lane
that breaks under a call (the actor restarted, or was deleted and killed) asks the actor over
Ray what happened and raises what Ray would have raised (``ServiceBusConnectionError``, or
``MessagingEntityNotFoundError`` for an actor gone for good).

When a lane is used: the actor runs on the caller's node (Unix sockets do not cross machines;
a caller elsewhere keeps Ray's calls), the platform is Linux (abstract socket names: no file to
leave behind), no argument is an ``ObjectRef`` (Ray resolves those; large router deliveries go
through the object store), and ``RAYBUS_LANES`` is not ``0``. The first call to an actor from
an event loop goes over Ray while the lane is set up behind it. The actor accepts a connection
only from a process of its own user (``SO_PEERCRED``): a pickle from anyone else is never read.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import socket
import struct
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from ray.actor import ActorHandle

__all__ = ["ENABLED", "Lane", "LaneBroken", "LaneServer", "find", "open_from"]

_log = logging.getLogger("raybus.lane")

ENABLED = sys.platform == "linux" and os.environ.get("RAYBUS_LANES", "1") != "0"

_HEADER = struct.Struct("!I")
# Past this many bytes waiting in the socket's buffer a call waits for it to drain.
_HIGH_WATER = 4 << 20
# An actor whose lane could not be set up is asked again after this long.
RETRY_S = 5.0


class LaneBroken(ConnectionError):
    """The lane's connection ended under a call: the call may or may not have run."""


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return _HEADER.pack(len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    header = await reader.readexactly(_HEADER.size)
    return pickle.loads(await reader.readexactly(_HEADER.unpack(header)[0]))


# ------------------------------------------------------------------ the actor's side


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class LaneServer:
    """Serves an actor's calls over an abstract Unix socket on the actor's loop.

    ``call_method(name, args, kwargs)`` runs one call and is given by the actor shell, which
    refuses the methods not meant for lanes (``Guarded._lane_call``). ``wrap_error`` turns an
    exception raised by a call into the one to send back (it must pickle)."""

    def __init__(
        self,
        call_method: Callable[[str, tuple[Any, ...], dict[str, Any]], Any],
        wrap_error: Callable[[BaseException], BaseException],
    ) -> None:
        self._call = call_method
        self._wrap = wrap_error
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self, name: str) -> str:
        """Listen (once) and return the address to connect to."""
        if self._server is None:
            address = f"\0raybus-lane-{name}-{os.getpid()}"
            self._server = await asyncio.start_unix_server(self._serve, address)
            self.address = address
        return self.address

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if _peer_uid(writer) != os.getuid():
            _log.warning("lane connection from another user refused")
            writer.close()
            return
        try:
            while True:
                request_id, name, args, kwargs = await _read_frame(reader)
                task = asyncio.get_running_loop().create_task(
                    self._run(writer, request_id, name, args, kwargs)
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the caller closed its lane
        except Exception:
            _log.exception("lane request unreadable; closing the connection")
        finally:
            writer.close()

    async def _run(
        self,
        writer: asyncio.StreamWriter,
        request_id: int,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            answer: tuple[int, bool, Any] = (request_id, True, await self._call(name, args, kwargs))
        except BaseException as exc:
            answer = (request_id, False, self._wrap(exc))
        try:
            data = _frame(answer)
        except Exception as exc:  # an answer or error that does not pickle
            data = _frame((request_id, False, self._wrap(TypeError(f"unpicklable answer: {exc}"))))
        if not writer.is_closing():
            writer.write(data)


# ------------------------------------------------------------------ the caller's side


class Lane:
    """One connection from an event loop to an actor; calls share it, answered by id."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        methods: frozenset[str] = frozenset(),
    ) -> None:
        self._reader, self._writer = reader, writer
        self.methods = methods  # the actor's methods served over the lane
        self.on_close: Callable[[], None] | None = None
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[tuple[bool, Any]]] = {}
        self.broken = False
        self._reading = asyncio.get_running_loop().create_task(self._read())

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The method's answer; its exception as raised in the actor; ``LaneBroken``."""
        if self.broken:
            raise LaneBroken("lane closed")
        request_id = next(self._ids)
        future: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._writer.write(_frame((request_id, name, args, kwargs)))
            if self._writer.transport.get_write_buffer_size() > _HIGH_WATER:
                await self._writer.drain()
            ok, value = await future
        except ConnectionError as exc:
            self.close()
            raise LaneBroken(str(exc)) from None
        finally:
            self._pending.pop(request_id, None)
        if ok:
            return value
        raise value

    async def _read(self) -> None:
        try:
            while True:
                request_id, ok, value = await _read_frame(self._reader)
                future = self._pending.get(request_id)
                if future is not None and not future.done():
                    future.set_result((ok, value))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            _log.exception("lane answer unreadable; closing the lane")
        finally:
            self.close()

    def close(self) -> None:
        if self.broken:
            return
        self.broken = True
        self._writer.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(LaneBroken("the actor's lane closed"))
        if self._reading is not asyncio.current_task():
            self._reading.cancel()
        if self.on_close is not None:
            self.on_close()


class _Unavailable:
    """No lane to this actor (another node, no lane method, setup failed) until ``until``."""

    __slots__ = ("until",)

    def __init__(self, until: float) -> None:
        self.until = until


_Entry = Lane | _Unavailable | asyncio.Task[None]
# Per event loop (a lane's streams belong to one), per actor id.
_lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, _Entry]] = (
    weakref.WeakKeyDictionary()
)
_node_id: str | None = None


def _my_node() -> str:
    global _node_id
    if _node_id is None:
        import ray

        _node_id = ray.get_runtime_context().get_node_id()
    return _node_id


def find(handle: Any) -> Lane | None:
    """The open lane to ``handle``'s actor from the running loop, or None (then the caller
    uses Ray, and a lane is set up behind it when there may be one). ``handle`` is a Ray
    actor handle: anything else (a test's stand-in) has no lane."""
    if not ENABLED or not isinstance(handle, ActorHandle):
        return None
    actor_id = handle._actor_id
    loop = asyncio.get_running_loop()
    entries = _lanes.get(loop)
    if entries is None:
        entries = _lanes[loop] = {}
    entry = entries.get(actor_id)
    if isinstance(entry, Lane) and not entry.broken:
        return entry
    if _setup_due(entry):
        entries[actor_id] = loop.create_task(_open(entries, actor_id, handle))
    return None


def open_from(loop: asyncio.AbstractEventLoop, handle: Any) -> bool:
    """Whether ``loop`` has an open lane to ``handle``'s actor; callable from any thread.
    When it has none and may get one, ``loop`` is asked to set it up (as ``find`` does)."""
    if not ENABLED or not isinstance(handle, ActorHandle):
        return False
    entry = _lanes.get(loop, {}).get(handle._actor_id)
    if isinstance(entry, Lane) and not entry.broken:
        return True
    if _setup_due(entry):
        loop.call_soon_threadsafe(find, handle)
    return False


def _setup_due(entry: _Entry | None) -> bool:
    """Whether an actor whose entry is ``entry`` (not an open lane) should get a lane set up:
    none yet, a lane that broke, or a failed setup whose time to try again came."""
    if isinstance(entry, _Unavailable):
        return time.monotonic() >= entry.until
    return not isinstance(entry, asyncio.Task)  # a task: being set up


def _connect(address: str) -> socket.socket:
    """A socket connected to ``address``. Made here and handed to asyncio: uvloop (the loop
    of Ray's async actors) fails to connect to an abstract name itself (EINVAL). A local
    connect does not wait on a peer; the timeout only bounds a full accept backlog."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _drop(entries: dict[Any, _Entry], actor_id: Any, lane: Lane) -> None:
    """Forget a lane that closed (an actor deleted is never called again: its entry would
    stay), unless a newer one took its place."""
    if entries.get(actor_id) is lane:
        del entries[actor_id]


async def _open(entries: dict[Any, _Entry], actor_id: Any, handle: Any) -> None:
    entry: _Entry = _Unavailable(time.monotonic() + RETRY_S)
    try:
        method = getattr(handle, "lane_address", None)
        if method is None:  # an actor class without lanes: not worth asking again soon
            entry = _Unavailable(float("inf"))
            return
        node, address, methods = await method.remote()
        if node != _my_node():
            entry = _Unavailable(float("inf"))
            return
        entry = Lane(*await asyncio.open_unix_connection(sock=_connect(address)), methods)
        entry.on_close = lambda lane=entry: _drop(entries, actor_id, lane)
    except Exception as exc:  # restarting, gone, refused: Ray's calls meanwhile
        _log.debug("no lane to actor %s: %r", actor_id, exc)
    finally:
        entries[actor_id] = entry
