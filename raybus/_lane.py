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
import collections
import itertools
import logging
import os
import pickle
import socket
import struct
import sys
import time
import typing
import weakref
from collections.abc import Callable
from typing import Any

from ray.actor import ActorHandle

from ._core.wire import pickle_pieces

__all__ = ["ENABLED", "Lane", "LaneBroken", "LaneServer", "find", "open_from"]

_log = logging.getLogger("raybus.lane")

ENABLED = sys.platform == "linux" and os.environ.get("RAYBUS_LANES", "1") != "0"

_HEADER = struct.Struct("!I")
# Past this many bytes waiting to be sent a call waits for them to drain.
_HIGH_WATER = 4 << 20
# A connection's read buffer (one per connection and side, so kept small); a frame longer
# than this is read into a buffer of its own.
_READ_BUFFER = 64 << 10
# The most of a long frame handed to the transport at once (and its write buffer's limit).
_CHUNK = 256 << 10
# Buffers of long frames kept for the next ones (a fresh one costs its pages' zeroing, twice).
_SPARE_BUFFERS = 4
_SPARE_BYTES = 64 << 20
# An actor whose lane could not be set up is asked again after this long.
RETRY_S = 5.0


class LaneBroken(ConnectionError):
    """The lane's connection ended under a call: the call may or may not have run."""


_spares: list[bytearray] = []  # this process's spare buffers for long frames


def _long_buffer(length: int) -> bytearray:
    """A buffer of at least ``length`` bytes: a spare one if one is long enough, else a new
    one rounded up to a power of two (frames' lengths vary: a receive's answer holds as many
    messages as were there; an exact fit would rarely be long enough for the next frame)."""
    for i, spare in enumerate(_spares):
        if len(spare) >= length:
            return _spares.pop(i)
    return bytearray(1 << (length - 1).bit_length())


def _give_back(buffer: bytearray) -> None:
    """Keep ``buffer`` for a later long frame, within the spares' bounds (the longest kept)."""
    _spares.append(buffer)
    _spares.sort(key=len)
    while len(_spares) > _SPARE_BUFFERS or sum(map(len, _spares)) > _SPARE_BYTES:
        _spares.pop(0)


class _Wire(asyncio.BufferedProtocol):
    """Frames (a 4-byte length and a pickle) over one connection, both ways, with few copies.

    Why not asyncio's streams: with frames of megabytes (a list of 100 bodies of 64 KiB, or a
    receive's answer) their buffers copied each frame several times and moved what was left
    after every read and write (a ``StreamReader`` grows one ``bytearray`` and cuts its head
    off; Python 3.11's socket transport does the same with what it could not send). py-spy on
    the 64 KiB benchmark put 66 % of a receiving process's Python time in ``StreamReader``.
    Here the transport reads into this protocol's buffer (``recv_into``: the kernel's copy
    only), a frame longer than the buffer straight into a buffer of its own size, and a long
    frame is written in pieces of at most ``_CHUNK`` while the transport takes them (flow
    control), so the transport never holds more than about ``_CHUNK`` of it; the bodies in it
    are not copied into the pickle (``raybus._core.wire.pickle_pieces``).

    ``on_frame(obj)`` gets each frame unpickled, in order; one that does not unpickle (or that
    ``on_frame`` rejects by raising) closes the connection, logged as ``what`` unreadable.
    ``on_lost()`` runs once when the connection ends. ``peer_check``, if given, sees the
    transport first and closes it, before anything is read, by answering False.
    """

    def __init__(
        self,
        on_frame: Callable[[Any], None],
        on_lost: Callable[[], None],
        what: str,
        peer_check: Callable[[asyncio.BaseTransport], bool] | None = None,
    ) -> None:
        self._on_frame, self._on_lost, self._what = on_frame, on_lost, what
        self._peer_check = peer_check
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray(_READ_BUFFER)
        self._start = 0  # the first byte not yet taken from _buf
        self._end = 0  # the bytes read into _buf
        self._long: bytearray | None = None  # a frame longer than _buf, being read into
        self._long_length = 0  # its length (the buffer may be longer)
        self._long_read = 0
        self._out: collections.deque[bytes | memoryview] = collections.deque()
        self._out_bytes = 0
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    # -- reading

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The transport's class is no subclass of asyncio.Transport under uvloop.
        self.transport = typing.cast(asyncio.Transport, transport)
        if self._peer_check is not None and not self._peer_check(transport):
            self.close()
            return
        self.transport.set_write_buffer_limits(high=_CHUNK)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._long is not None:
            return memoryview(self._long)[self._long_read : self._long_length]
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        if self._long is not None:
            self._long_read += nbytes
            if self._long_read == self._long_length:
                buffer, self._long = self._long, None
                try:
                    self._deliver(memoryview(buffer)[: self._long_length])
                finally:
                    _give_back(buffer)  # unpickling copied out all it needs
            return
        self._end += nbytes
        self._take()

    def _take(self) -> None:
        """Deliver the whole frames in ``_buf``; make room for the rest of a partial one."""
        buf = self._buf
        while not self.closed:
            have = self._end - self._start
            need = _HEADER.size
            if have >= need:
                (length,) = _HEADER.unpack_from(buf, self._start)
                need += length
                if have >= need:
                    begin = self._start + _HEADER.size
                    self._start += need
                    self._deliver(memoryview(buf)[begin : begin + length])
                    continue
                if need > len(buf):  # read the rest straight into the frame's own buffer
                    self._long = _long_buffer(length)
                    self._long_length = length
                    self._long[: have - _HEADER.size] = buf[self._start + _HEADER.size : self._end]
                    self._long_read = have - _HEADER.size
                    self._start = self._end = 0
                    return
            if have == 0:
                self._start = self._end = 0
            elif self._start + need > len(buf):  # the frame's end would not fit: move it
                buf[:have] = buf[self._start : self._end]
                self._start, self._end = 0, have
            return

    def _deliver(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._on_frame(pickle.loads(data))
        except Exception:
            _log.exception("lane %s unreadable; closing the connection", self._what)
            self.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("lane closed"))
            self._drained.exception()  # its waiters may all have gone: no warning then
        self._on_lost()

    # -- writing

    def send(self, obj: Any) -> None:
        """Queue ``obj`` as one frame. Raises ``ConnectionResetError`` if the connection is
        closed, or what pickling raises (then nothing is sent)."""
        if self.closed or self.transport is None:
            raise ConnectionResetError("lane closed")
        pieces = pickle_pieces(obj)
        length = sum(map(len, pieces))
        header = _HEADER.pack(length)
        if length <= _CHUNK and not self._out:
            self.transport.write(b"".join([header, *pieces]))
            return
        out = self._out
        out.append(header)
        for piece in pieces:
            if len(piece) <= _CHUNK:
                out.append(piece)
            else:
                view = memoryview(piece)
                out.extend(view[i : i + _CHUNK] for i in range(0, len(piece), _CHUNK))
        self._out_bytes += len(header) + length
        self._push()

    def _push(self) -> None:
        assert self.transport is not None
        while self._out and not self._paused and not self.closed:
            piece = self._out.popleft()
            self._out_bytes -= len(piece)
            self.transport.write(piece)  # may pause us (flow control) before it returns
        if not self._out and not self._paused and self._drained is not None:
            if not self._drained.done():
                self._drained.set_result(None)
            self._drained = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._push()

    def backlog(self) -> int:
        """Bytes queued and not yet taken by the socket."""
        buffered = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self._out_bytes + buffered

    async def drain(self) -> None:
        """Wait until the queued pieces are handed to the transport and it is not paused."""
        if self.closed:
            raise ConnectionResetError("lane closed")
        if not self._out and not self._paused:
            return
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True


# ------------------------------------------------------------------ the actor's side


def _peer_uid(transport: asyncio.BaseTransport) -> int | None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _same_user(transport: asyncio.BaseTransport) -> bool:
    if _peer_uid(transport) == os.getuid():
        return True
    _log.warning("lane connection from another user refused")
    return False


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
            loop = asyncio.get_running_loop()
            self._server = await loop.create_unix_server(self._accept, address)
            self.address = address
        return self.address

    def _accept(self) -> _Wire:
        wire = _Wire(lambda request: self._request(wire, request), _nothing, "request", _same_user)
        return wire

    def _request(self, wire: _Wire, request: Any) -> None:
        request_id, name, args, kwargs = request
        task = asyncio.get_running_loop().create_task(
            self._run(wire, request_id, name, args, kwargs)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        wire: _Wire,
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
            wire.send(answer)
        except ConnectionError:
            pass  # the caller closed its lane
        except Exception as exc:  # an answer or error that does not pickle
            error = self._wrap(TypeError(f"unpicklable answer: {exc}"))
            wire.send((request_id, False, error))


def _nothing() -> None:
    pass


# ------------------------------------------------------------------ the caller's side


class Lane:
    """One connection from an event loop to an actor; calls share it, answered by id.
    ``Lane.connect`` makes one."""

    def __init__(self, methods: frozenset[str] = frozenset()) -> None:
        self.methods = methods  # the actor's methods served over the lane
        self.on_close: Callable[[], None] | None = None
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[tuple[bool, Any]]] = {}
        self.broken = False
        self._wire = _Wire(self._answer, self.close, "answer")

    @classmethod
    async def connect(cls, address: str, methods: frozenset[str] = frozenset()) -> Lane:
        lane = cls(methods)
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: lane._wire, sock=_connect(address))
        return lane

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The method's answer; its exception as raised in the actor; ``LaneBroken``."""
        if self.broken:
            raise LaneBroken("lane closed")
        request_id = next(self._ids)
        future: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._wire.send((request_id, name, args, kwargs))
            if self._wire.backlog() > _HIGH_WATER:
                await self._wire.drain()
            ok, value = await future
        except ConnectionError as exc:
            self.close()
            raise LaneBroken(str(exc)) from None
        finally:
            self._pending.pop(request_id, None)
        if ok:
            return value
        raise value

    def _answer(self, answer: Any) -> None:
        request_id, ok, value = answer
        future = self._pending.get(request_id)
        if future is not None and not future.done():
            future.set_result((ok, value))

    def close(self) -> None:
        if self.broken:
            return
        self.broken = True
        self._wire.close()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(LaneBroken("the actor's lane closed"))
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
        entry = await Lane.connect(address, methods)
        entry.on_close = lambda lane=entry: _drop(entries, actor_id, lane)
    except Exception as exc:  # restarting, gone, refused: Ray's calls meanwhile
        _log.debug("no lane to actor %s: %r", actor_id, exc)
    finally:
        entries[actor_id] = entry
