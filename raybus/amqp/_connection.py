"""One AMQP 1.0 connection: protocol headers, SASL ANONYMOUS, open/begin/end/close, frame
dispatch to links, and the session bookkeeping (transfer ids, delivery ids, windows).

Guarantee: a malformed or truncated frame, or any unexpected failure while handling one, closes
*this* connection (with an AMQP ``close`` carrying the error when the socket still works) and
nothing else; the gateway keeps serving its other connections. Slow work (raybus calls) never
runs on the read loop: links hand it to tasks, so one slow receiver does not stall the others
sharing the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from ._codec import DecodeError, UInt, UShort
from ._frames import (
    AMQP_HEADER,
    FRAME_AMQP,
    FRAME_SASL,
    MIN_MAX_FRAME_SIZE,
    SASL_HEADER,
    Performative,
    decode_body,
    error,
    flow_fields,
    frame,
    parse_header,
    performative,
    sasl_mechanisms,
    sasl_outcome,
)

if TYPE_CHECKING:
    from ._gateway import Gateway
    from ._links import Link

__all__ = ["AmqpConnection", "Session"]

_LOG = logging.getLogger("raybus.amqp")

MAX_FRAME_SIZE = 1024 * 1024  # what we accept; peers split larger transfers
_WINDOW = 2**31 - 1  # session windows: flow is governed by link credit, not by sessions
_HANDSHAKE_TIMEOUT_S = 30.0
_FINISH_S = 10.0  # how long a close waits for settlements under way


class ProtocolError(Exception):
    """A peer broke the protocol (not a decoding problem): closes the connection with
    ``condition``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(condition, description)
        self.condition = condition
        self.description = description


class Session:
    """One begun session: its channel, transfer/delivery counters and links by handle."""

    def __init__(self, conn: AmqpConnection, channel: int, begin: Performative) -> None:
        self.conn = conn
        self.channel = channel
        self.next_outgoing_id = 0  # transfer-id of our next transfer frame
        self.next_incoming_id = int(begin.get("next_outgoing_id", 0))
        self.next_delivery_id = 0
        self.links: dict[int, Link] = {}  # by the peer's handle
        self.sent: dict[int, Link] = {}  # our unsettled deliveries: delivery-id -> link

    def flow(self, **fields: Any) -> None:
        """Send a flow frame (session fields filled in; link fields from ``fields``)."""
        body = performative(
            "flow",
            **flow_fields(self.next_incoming_id, _WINDOW, self.next_outgoing_id, _WINDOW),
            **fields,
        )
        self.conn.write(frame(body, self.channel))

    def send(self, kind: str, /, **fields: Any) -> None:
        self.conn.write(frame(performative(kind, **fields), self.channel))

    def transfer(
        self, link: Link, tag: bytes, payload: bytes, *, settled: bool, message_format: int = 0
    ) -> int:
        """Send one delivery (split into frames of the peer's max-frame-size); returns its
        delivery-id."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) & 0xFFFFFFFF
        first = {
            "handle": UInt(link.handle),
            "delivery_id": UInt(delivery_id),
            "delivery_tag": tag,
            "message_format": UInt(message_format),
            "settled": settled,
        }
        room = (
            self.conn.remote_max_frame_size
            - 8
            - len(performative("transfer", **first, more=True))
            - 16
        )
        frames = []
        pos = 0
        while True:
            chunk = payload[pos : pos + room]
            pos += len(chunk)
            more = pos < len(payload)
            body = performative("transfer", **first, more=more or None) + chunk
            frames.append(frame(body, self.channel))
            if not more:
                break
        self.next_outgoing_id = (self.next_outgoing_id + len(frames)) & 0xFFFFFFFF
        self.conn.write(b"".join(frames))
        if not settled:
            self.sent[delivery_id] = link
        return delivery_id


def _lock_ended(message: Any, before: float) -> bool:
    """Whether ``message``'s lock ended before ``before`` (epoch seconds)."""
    until = message.locked_until_utc
    return until is None or until.timestamp() < before


class AmqpConnection:
    """Serves one client socket until it closes (``run``)."""

    def __init__(
        self, gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.gateway = gateway
        self.reader = reader
        self.writer = writer
        self.id = uuid.uuid4().hex[:8]
        self.remote_max_frame_size = MAX_FRAME_SIZE
        self.sessions: dict[int, Session] = {}  # by the peer's channel
        self.tokens: dict[str, str] = {}  # CBS audience -> SAS token
        # Lock token -> (link that delivered it, raybus message), for $management operations.
        self.locks: dict[str, tuple[Any, Any]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._finishing: set[asyncio.Task[Any]] = set()  # run to their end at a close
        from ._transactions import Transactions  # (it imports the links, which import this)

        self.transactions = Transactions()  # declared through a coordinator link
        self._held = 0
        self._closed = False

    # ------------------------------------------------------------------ plumbing

    def hold(self, lock_token: str, link: Any, message: Any) -> None:
        """Remember a locked message for ``$management`` operations by lock token. Messages
        the SDK never settled would pile up on a long-lived connection, so every 1024th call
        drops those whose lock ended a minute ago or more."""
        self.locks[lock_token] = (link, message)
        self.gateway.lock_index.remember(lock_token, message.sequence_number)
        self._held += 1
        if self._held % 1024 == 0:
            stale = time.time() - 60.0
            for token in [t for t, (_l, m) in self.locks.items() if _lock_ended(m, stale)]:
                del self.locks[token]

    def release(self, lock_token: str) -> None:
        """Forget a lock once its message is settled (here or through ``$management``)."""
        self.locks.pop(lock_token, None)
        self.gateway.lock_index.forget(lock_token)

    def write(self, data: bytes) -> None:
        if not self._closed:
            self.writer.write(data)

    def spawn(self, coro: Any, *, finish: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` as part of this connection: a failure in it closes the connection.
        With ``finish``, a close lets it run to its end (briefly) instead of cancelling it."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        if finish:
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        _LOG.warning("amqp connection %s: task failed: %r", self.id, exc)
        self.fail("amqp:internal-error", f"gateway error: {exc}")

    def fail(self, condition: str, description: str) -> None:
        """Close the connection with an error (best effort) and stop reading."""
        if self._closed:
            return
        self.write(frame(performative("close", error=error(condition, description))))
        self._closed = True
        with contextlib.suppress(Exception):
            self.writer.close()

    async def _read_frame(self) -> tuple[int, int, bytes]:
        header = await self.reader.readexactly(8)
        size, doff, kind, channel = parse_header(header, MAX_FRAME_SIZE)
        body = await self.reader.readexactly(size - 8)
        return kind, channel, body[doff - 8 :]

    async def _expect(self, kind: int, name: str) -> Performative:
        while True:
            got_kind, _channel, body = await self._read_frame()
            if not body:
                continue  # heartbeat
            if got_kind != kind:
                raise ProtocolError("amqp:connection:framing-error", f"expected a {name} frame")
            perf, _payload = decode_body(body)
            if perf.name != name:
                raise ProtocolError(
                    "amqp:connection:framing-error", f"expected {name}, got {perf.name}"
                )
            return perf

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        try:
            await asyncio.wait_for(self._handshake(), _HANDSHAKE_TIMEOUT_S)
            await self._loop()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass  # the peer went away (or never finished the handshake)
        except DecodeError as exc:
            _LOG.info("amqp connection %s: malformed input: %s", self.id, exc)
            self.fail("amqp:decode-error", str(exc))
        except ProtocolError as exc:
            _LOG.info("amqp connection %s: %s", self.id, exc.description)
            self.fail(exc.condition, exc.description)
        except Exception as exc:  # never let one connection take the gateway down
            _LOG.exception("amqp connection %s failed", self.id)
            self.fail("amqp:internal-error", f"gateway error: {exc}")
        finally:
            await self._teardown()

    async def _handshake(self) -> None:
        header = await self.reader.readexactly(8)
        if header == SASL_HEADER:
            self.write(SASL_HEADER + sasl_mechanisms("ANONYMOUS", "MSSBCBS"))
            init = await self._expect(FRAME_SASL, "sasl_init")
            if str(init.get("mechanism", "")) not in ("ANONYMOUS", "MSSBCBS"):
                self.write(sasl_outcome(1))  # auth: tokens come through CBS instead
                raise ProtocolError("amqp:unauthorized-access", "only SASL ANONYMOUS is offered")
            self.write(sasl_outcome(0))
            header = await self.reader.readexactly(8)
        if header != AMQP_HEADER:
            self.write(AMQP_HEADER)  # the spec: answer with the header we do support, close
            raise asyncio.IncompleteReadError(b"", None)
        self.write(AMQP_HEADER)
        opened = await self._expect(FRAME_AMQP, "open")
        peer_max = int(opened.get("max_frame_size", 2**32 - 1))
        self.remote_max_frame_size = max(MIN_MAX_FRAME_SIZE, min(peer_max, MAX_FRAME_SIZE))
        self.write(
            frame(
                performative(
                    "open",
                    container_id=f"raybus-gateway-{self.id}",
                    hostname=opened.get("hostname"),
                    max_frame_size=UInt(MAX_FRAME_SIZE),
                    channel_max=UShort(255),
                )
            )
        )
        idle_ms = opened.get("idle_time_out")
        if idle_ms:
            self.spawn(self._heartbeat(int(idle_ms) / 2000))

    async def _heartbeat(self, every_s: float) -> None:
        while not self._closed:
            await asyncio.sleep(max(every_s, 0.05))
            self.write(frame(b""))

    async def _loop(self) -> None:
        while not self._closed:
            kind, channel, body = await self._read_frame()
            if not body:
                continue
            if kind != FRAME_AMQP:
                raise ProtocolError("amqp:connection:framing-error", "SASL frame after open")
            perf, payload = decode_body(body)
            if _LOG.isEnabledFor(logging.DEBUG):
                _LOG.debug("amqp %s <- ch%s %s %s", self.id, channel, perf.name, perf.fields)
            if perf.name == "close":
                self.write(frame(performative("close")))
                await self.writer.drain()
                return
            self._dispatch(channel, perf, payload)
            if self.writer.transport.get_write_buffer_size() > 4 * MAX_FRAME_SIZE:
                await self.writer.drain()

    def _dispatch(self, channel: int, perf: Performative, payload: memoryview) -> None:
        name = perf.name
        if name == "begin":
            if channel in self.sessions:
                raise ProtocolError("amqp:connection:framing-error", f"channel {channel} in use")
            session = self.sessions[channel] = Session(self, channel, perf)
            session.send(
                "begin",
                remote_channel=UShort(channel),
                **{
                    k: v
                    for k, v in flow_fields(0, _WINDOW, 0, _WINDOW).items()
                    if k in ("next_outgoing_id", "incoming_window", "outgoing_window")
                },
                handle_max=UInt(2**32 - 1),
            )
            return
        found = self.sessions.get(channel)
        if found is None:
            # pyamqp sends a detach after its end; frames for a channel without a session
            # have nothing left to act on.
            _LOG.debug("amqp %s: %s on channel %s without a session", self.id, name, channel)
            return
        session = found
        if name == "end":
            self.sessions.pop(channel)
            for link in list(session.links.values()):
                link.detached(None)
            session.send("end")
        elif name == "attach":
            from ._links import make_link  # links import this module

            handle = int(perf.get("handle", 0))
            if handle in session.links:
                raise ProtocolError("amqp:session:handle-in-use", f"handle {handle} in use")
            link = make_link(session, perf)
            session.links[handle] = link
            self.spawn(link.attach())
        elif name == "flow":
            session.next_incoming_id = int(perf.get("next_outgoing_id", session.next_incoming_id))
            handle = perf.get("handle")
            if handle is not None:
                self._link(session, handle).on_flow(perf)
            elif perf.get("echo"):
                session.flow()
        elif name == "transfer":
            session.next_incoming_id = (session.next_incoming_id + 1) & 0xFFFFFFFF
            self._link(session, perf.get("handle")).on_transfer(perf, payload)
        elif name == "disposition":
            self._disposition(session, perf)
        elif name == "detach":
            handle = int(perf.get("handle", 0))
            gone = session.links.pop(handle, None)
            if gone is not None:
                gone.detached(perf.get("error"))
                session.send("detach", handle=UInt(handle), closed=True)
        else:
            raise ProtocolError("amqp:not-implemented", f"unexpected {name}")

    def _link(self, session: Session, handle: Any) -> Link:
        link = session.links.get(int(handle)) if handle is not None else None
        if link is None:
            raise ProtocolError("amqp:session:unattached-handle", f"no link on handle {handle}")
        return link

    def _disposition(self, session: Session, perf: Performative) -> None:
        """The peer's disposition of deliveries we sent (role receiver)."""
        if not perf.get("role"):
            return  # the peer as sender settling our outcomes: nothing to do
        first = int(perf.get("first", 0))
        last = int(perf.get("last", first))
        if last - first > 100_000:
            raise ProtocolError("amqp:invalid-field", "disposition range too large")
        settled = bool(perf.get("settled"))
        for delivery_id in range(first, last + 1):
            link = session.sent.pop(delivery_id, None)
            if link is not None:
                link.on_disposition(delivery_id, perf.get("state"), settled)

    async def _teardown(self) -> None:
        self._closed = True
        # Settlements whose dispositions arrived before the close (the SDK releases what a
        # closing receiver holds) still reach the broker: cancelled before their call, they
        # would leave their messages locked until the locks ran out. Their answers are not
        # written (the socket is closing).
        if self._finishing:
            await asyncio.wait(list(self._finishing), timeout=_FINISH_S)
        for task in list(self.tasks):
            task.cancel()
        links = [link for s in self.sessions.values() for link in s.links.values()]
        self.sessions.clear()
        for link in links:
            link.detached(None)
        # Let the links give back what they hold (releases, session unlocks), briefly.
        closing = [link.closing for link in links if link.closing is not None]
        if closing:
            await asyncio.wait(closing, timeout=10)
        await self.transactions.close()
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()
        self.gateway.forget(self)


def lock_tag(lock_token: str) -> bytes:
    """A lock token as the 16-byte delivery tag the SDK expects (.NET GUID byte order)."""
    return uuid.UUID(lock_token).bytes_le


def tag_token(tag: bytes) -> str:
    if len(tag) != 16:
        raise DecodeError(f"a lock token is 16 bytes, not {len(tag)}")
    return str(uuid.UUID(bytes_le=bytes(tag)))
