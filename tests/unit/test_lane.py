"""Lanes (``raybus._lane``): a call over a Unix socket to the same method Ray would call. These
tests run both ends on one event loop, without Ray: answers and errors come back to the call
that made them, calls start in the order sent, a lane that breaks fails the calls under it,
and only guarded methods are served."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray import exceptions as rex

from raybus import _lane, _rpc
from raybus._actors.access import Guarded, _lane_error, _lane_methods, guarded
from raybus._core.access import ANY
from raybus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusError,
)


class _Echo:
    """A stand-in actor: records the order calls started in, answers or raises as asked."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.release = asyncio.Event()

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.started.append(args[0] if args else None)
        if name == "echo":
            return (args, kwargs)
        if name == "slow":
            await self.release.wait()
            return args[0]
        if name == "refuse":
            raise MessageSizeExceededError("too big", "q")
        if name == "unpicklable":
            return lambda: None
        raise AssertionError(name)


async def _pair(echo: _Echo) -> tuple[_lane.LaneServer, _lane.Lane]:
    server = _lane.LaneServer(echo.call, _lane_error)
    address = await server.start(f"test-{id(echo)}")
    return server, await _lane.Lane.connect(address)


async def test_a_call_gets_its_own_answer_among_concurrent_ones() -> None:
    echo = _Echo()
    _server, lane = await _pair(echo)
    answers = await asyncio.gather(
        *(lane.call("echo", (i, b"x" * i), {"_auth": f"t{i}"}) for i in range(50))
    )
    assert answers == [((i, b"x" * i), {"_auth": f"t{i}"}) for i in range(50)]
    lane.close()


async def test_long_frames_among_short_ones_reach_their_own_calls_whole() -> None:
    """Lists of 64 KiB bodies (frames far past the read buffer and the write pieces, together
    past the point where a call waits for the socket to drain) and short calls at once."""
    _server, lane = await _pair(_Echo())
    long = [[bytes([i, k]) * (32 << 10) for k in range(20 + i)] for i in range(8)]
    calls = [lane.call("echo", (bodies,), {}) for bodies in long]
    calls += [lane.call("echo", (i,), {}) for i in range(20)]
    answers = await asyncio.wait_for(asyncio.gather(*calls), 30)
    assert [args[0] for args, _kw in answers] == [*long, *range(20)]
    assert sum(map(len, map(pickle.dumps, long))) > _lane._HIGH_WATER
    assert len(_lane._spares) <= _lane._SPARE_BUFFERS  # buffers of long frames kept, bounded
    lane.close()


async def test_a_call_waiting_for_a_peer_that_does_not_read_fails_when_the_lane_breaks() -> None:
    """A frame past the drain mark to a peer that reads nothing: the call waits (its pieces
    queued, not all handed to the socket), then fails as a broken lane when the peer goes."""
    peers: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer)

    address = f"\0raybus-test-noread-{os.getpid()}-{id(peers)}"
    server = await asyncio.start_unix_server(hold, address)
    lane = await _lane.Lane.connect(address)
    call = asyncio.ensure_future(lane.call("echo", (os.urandom(_lane._HIGH_WATER * 2),), {}))
    await asyncio.sleep(0.2)
    assert not call.done()
    assert lane._wire._out  # pieces still queued: the socket's buffer is full
    peers[0].transport.abort()
    with pytest.raises(_lane.LaneBroken):
        await asyncio.wait_for(call, 5)
    assert lane.broken and not lane._wire._out
    server.close()


async def test_an_answer_that_does_not_unpickle_breaks_the_lane_and_fails_its_call() -> None:
    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # a request came
        data = b"not a pickle"
        writer.write(_lane._HEADER.pack(len(data)) + data)

    address = f"\0raybus-test-junk-{os.getpid()}-{id(junk)}"
    server = await asyncio.start_unix_server(junk, address)
    lane = await _lane.Lane.connect(address)
    with pytest.raises(_lane.LaneBroken):
        await asyncio.wait_for(lane.call("echo", (1,), {}), 5)
    assert lane.broken
    server.close()


def _feed(wire: _lane._Wire, stream: bytes, reads: list[int]) -> None:
    """Hand ``stream`` to ``wire`` as a transport would: ``reads`` bytes at a time (cycled),
    each at most what ``get_buffer`` offers."""
    at, k = 0, 0
    while at < len(stream):
        buffer = wire.get_buffer(-1)
        assert len(buffer) > 0
        n = min(len(buffer), reads[k % len(reads)], len(stream) - at)
        buffer[:n] = stream[at : at + n]
        wire.buffer_updated(n)
        at, k = at + n, k + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=12),
    reads=st.lists(st.integers(1, 400), min_size=1, max_size=8),
)
def test_frames_split_anywhere_by_the_reads_arrive_whole_and_in_order(
    sizes: list[int], reads: list[int]
) -> None:
    """The read buffer is shrunk to 64 bytes so frames end inside it, across its end (moved
    to its front) and past it (read into a buffer of their own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_lane, "_READ_BUFFER", 64)
        got: list[Any] = []
        wire = _lane._Wire(got.append, lambda: None, "test")
        frames = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
        stream = b"".join(
            _lane._HEADER.pack(len(data)) + data
            for data in (pickle.dumps(f, protocol=5) for f in frames)
        )
        _feed(wire, stream, reads)
        assert got == frames
        assert not wire.closed


def test_spare_buffers_of_long_frames_are_reused_and_bounded() -> None:
    _lane._spares.clear()
    first = _lane._long_buffer(1000)
    assert len(first) == 1024  # rounded up: the next frame may be a little longer
    _lane._give_back(first)
    assert _lane._long_buffer(1024) is first
    _lane._give_back(first)
    assert _lane._long_buffer(800) is first  # long enough: reused, not zeroed anew
    assert _lane._long_buffer(2000) is not first
    for n in range(10):
        _lane._give_back(bytearray(100 + n))
    assert len(_lane._spares) == _lane._SPARE_BUFFERS
    assert [len(b) for b in _lane._spares] == [106, 107, 108, 109]  # the longest kept
    _lane._give_back(bytearray(_lane._SPARE_BYTES))
    assert sum(map(len, _lane._spares)) <= _lane._SPARE_BYTES
    _lane._spares.clear()


async def test_calls_start_in_the_order_sent_and_a_slow_one_holds_up_no_other() -> None:
    echo = _Echo()
    _server, lane = await _pair(echo)
    slow = asyncio.ensure_future(lane.call("slow", ("first",), {}))
    quick = [asyncio.ensure_future(lane.call("echo", (i,), {})) for i in range(5)]
    done = await asyncio.gather(*quick)
    assert [args[0] for args, _kw in done] == list(range(5))
    assert not slow.done()  # answered out of order: the slow call is still running
    assert echo.started == ["first", 0, 1, 2, 3, 4]
    echo.release.set()
    assert await slow == "first"
    lane.close()


async def test_the_methods_error_is_raised_by_the_call_with_its_type() -> None:
    _server, lane = await _pair(_Echo())
    with pytest.raises(MessageSizeExceededError, match="too big"):
        await lane.call("refuse", (), {})
    assert await lane.call("echo", (1,), {}) == ((1,), {})  # the lane is still usable
    lane.close()


async def test_an_answer_that_does_not_pickle_becomes_an_error_not_a_hang() -> None:
    _server, lane = await _pair(_Echo())
    with pytest.raises(TypeError, match="unpicklable answer"):
        await asyncio.wait_for(lane.call("unpicklable", (), {}), 5)
    lane.close()


async def test_a_lane_closed_under_a_call_fails_it_and_every_later_call() -> None:
    echo = _Echo()
    _server, lane = await _pair(echo)
    slow = asyncio.ensure_future(lane.call("slow", ("x",), {}))
    while not echo.started:
        await asyncio.sleep(0.01)
    lane._wire.transport.abort()  # as when the actor's process dies
    with pytest.raises(_lane.LaneBroken):
        await asyncio.wait_for(slow, 5)
    assert lane.broken
    with pytest.raises(_lane.LaneBroken):
        await lane.call("echo", (1,), {})
    echo.release.set()


async def test_a_request_that_does_not_unpickle_closes_the_connection() -> None:
    echo = _Echo()
    server = _lane.LaneServer(echo.call, _lane_error)
    address = await server.start(f"test-bad-{id(echo)}")
    reader, writer = await asyncio.open_unix_connection(sock=_lane._connect(address))
    junk = b"not a pickle"
    writer.write(_lane._HEADER.pack(len(junk)) + junk)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing run
    assert echo.started == []


async def test_a_connection_from_another_user_is_closed_before_anything_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    echo = _Echo()
    server, lane = await _pair(echo)
    assert await lane.call("echo", (1,), {}) == ((1,), {})  # this user's: served
    monkeypatch.setattr(_lane, "_peer_uid", lambda _transport: os.getuid() + 1)
    other = await _lane.Lane.connect(server.address)
    with pytest.raises(_lane.LaneBroken):
        await asyncio.wait_for(other.call("echo", (2,), {}), 5)
    assert echo.started == [1]
    lane.close()


class _Actor(Guarded):
    _namespace = "ns"

    @guarded(ANY, lane=True)
    async def open_method(self, x: int) -> int:
        return x + 1

    @guarded(ANY)
    async def ray_only(self) -> str:
        return "guarded, not marked for lanes"

    async def unguarded(self) -> str:
        return "never over a lane"


async def test_the_actor_serves_guarded_methods_only() -> None:
    actor = _Actor()

    async def guard() -> Any:
        class _Guard:
            def check(self, *_args: Any) -> None:
                pass

        return _Guard()

    actor._access_guard = guard  # type: ignore[method-assign]
    # not mark_deleted, set_access, ... nor ray_only
    assert _lane_methods(_Actor) == {"open_method"}

    assert await actor._lane_call("open_method", (1,), {"_auth": None}) == 2
    for name in ("unguarded", "ray_only", "mark_deleted"):
        with pytest.raises(ValueError, match=f"'{name}' is not a method"):
            await actor._lane_call(name, (), {})
    with pytest.raises(ValueError, match="'__init__' is not a method"):
        await actor._lane_call("__init__", (), {})


def test_errors_sent_back_pickle_and_a_cancel_is_an_internal_error() -> None:
    sent = _lane_error(MessageSizeExceededError("big", "q"))
    assert isinstance(pickle.loads(pickle.dumps(sent)), MessageSizeExceededError)
    cancelled = _lane_error(asyncio.CancelledError())
    assert isinstance(cancelled, ServiceBusError)
    assert "internal broker error" in str(cancelled)


async def test_open_from_answers_for_a_loop_and_asks_it_to_set_a_lane_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class _Handle:
        _actor_id = "actor-1"

    found: list[Any] = []
    monkeypatch.setattr(_lane, "ActorHandle", _Handle)
    monkeypatch.setattr(_lane, "find", found.append)
    loop = asyncio.get_running_loop()
    handle = _Handle()
    entries = _lane._lanes.setdefault(loop, {})
    assert not _lane.open_from(loop, handle)  # nothing yet: the loop is asked
    await asyncio.sleep(0)
    assert found == [handle]
    _server, lane = await _pair(_Echo())
    entries["actor-1"] = lane
    assert _lane.open_from(loop, handle)
    lane.close()
    assert not _lane.open_from(loop, handle)  # broken: asked again
    entries["actor-1"] = _lane._Unavailable(float("inf"))
    assert not _lane.open_from(loop, handle)  # another node: not asked
    await asyncio.sleep(0)
    assert found == [handle, handle]
    del entries["actor-1"]


async def test_a_lane_set_up_for_an_actor_is_forgotten_once_it_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An actor deleted is never called again: its closed lane must not stay behind."""
    server = _lane.LaneServer(_Echo().call, _lane_error)
    address = await server.start(f"test-forget-{id(server)}")

    class _Method:
        async def remote(self) -> tuple[str, str, frozenset[str]]:
            return "this-node", address, frozenset({"echo"})

    class _Handle:
        lane_address = _Method()

    monkeypatch.setattr(_lane, "_my_node", lambda: "this-node")
    entries: dict[Any, Any] = {}
    await _lane._open(entries, "actor-1", _Handle())
    lane = entries["actor-1"]
    assert lane.methods == {"echo"}
    assert await lane.call("echo", (1,), {}) == ((1,), {})
    lane._wire.transport.abort()  # the actor's process ends
    for _ in range(100):
        if "actor-1" not in entries:
            break
        await asyncio.sleep(0.01)
    assert entries == {}
    assert lane.broken


class _BreakingLane:
    """A lane whose first ``breaks`` calls break under them, then answers ``"ok"``."""

    methods = frozenset({"send_groups"})

    def __init__(self, breaks: int) -> None:
        self.breaks = breaks
        self.calls = 0

    async def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls <= self.breaks:
            raise _lane.LaneBroken("the actor's process ended")
        return "ok"


class _Asked:
    """The actor's handle as ``_rpc`` asks it over Ray after a lane broke."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    @property
    def lane_address(self) -> Any:
        error = self.error

        class _Method:
            def remote(self) -> Any:
                class _Ref:
                    def future(self) -> concurrent.futures.Future[Any]:
                        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
                        if error is None:
                            done.set_result(("node", "address", frozenset()))
                        else:
                            done.set_exception(error)
                        return done

                return _Ref()

        return _Method()


class _Method:
    _method_name = "send_groups"


def _lane_call(
    monkeypatch: pytest.MonkeyPatch,
    lane: _BreakingLane,
    handle: _Asked,
    retries: int = 0,
    **options: Any,
) -> Any:
    monkeypatch.setattr(_rpc, "_over_lane", lambda _method, _args: (lane, handle, {}))
    monkeypatch.setattr(_rpc.asyncio, "sleep", _no_sleep)
    return _rpc.call("q", _Method(), retries=retries, **options)


async def _no_sleep(_seconds: float) -> None:
    return None


async def test_a_call_whose_lane_breaks_raises_a_connection_error_if_the_actor_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ServiceBusConnectionError) as info:
        await _lane_call(monkeypatch, _BreakingLane(1), _Asked(None))
    assert info.value.entity == "q"


async def test_a_call_whose_lane_breaks_on_an_actor_gone_for_good_raises_not_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(MessagingEntityNotFoundError):
        await _lane_call(monkeypatch, _BreakingLane(1), _Asked(rex.ActorDiedError()))


async def test_a_call_with_retries_is_made_again_after_its_lane_broke(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lane = _BreakingLane(1)
    assert await _lane_call(monkeypatch, lane, _Asked(None), retries=1) == "ok"
    assert lane.calls == 2
    gone = _BreakingLane(5)  # an actor gone for good is not called again
    with pytest.raises(MessagingEntityNotFoundError):
        await _lane_call(monkeypatch, gone, _Asked(rex.ActorDiedError()), retries=3)
    assert gone.calls == 1


async def test_a_calls_timeout_covers_its_repeats_and_the_waits_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the SDK's operation timeout: a repeat whose back-off would end past the timeout is
    not made; the last error is raised instead."""
    long_wait = _BreakingLane(1)
    with pytest.raises(ServiceBusConnectionError):
        await _lane_call(
            monkeypatch, long_wait, _Asked(None), retries=3, timeout=5, backoff=lambda n, e: 10.0
        )
    assert long_wait.calls == 1
    short_wait = _BreakingLane(2)
    result = await _lane_call(
        monkeypatch, short_wait, _Asked(None), retries=3, timeout=5, backoff=lambda n, e: 1.0
    )
    assert result == "ok" and short_wait.calls == 3
