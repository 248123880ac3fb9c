"""The benchmark suite's warm-up protocol, without Ray or a broker: the suite's ``prepare``
commands (benchmarks/suite.py) drive a sender and a receiver worker (benchmarks/_worker.py)
through ``warm`` and ``go`` over an in-memory fake system. Both sides must agree on the warm-up
count (a mismatch once failed the 32/100-sender cells only in a full run), and the timed run
must start only after the warm-up is done."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _worker
import suite
from _peer_base import SYSTEMS, parse_body

SIZE = 64
N = 40


class Broker:
    """One queue per source; a sent message goes to every source (a topic's subscriptions,
    or the one queue). ``log`` records every send, receive and the driver's ``go`` in order."""

    def __init__(self, sources: int) -> None:
        self.queues: list[asyncio.Queue[bytes]] = [asyncio.Queue() for _ in range(sources)]
        self.log: list[tuple[Any, ...]] = []
        self.unsettled = 0
        self.stopped = 0
        self.closed = 0


class Sender:
    count = 0

    def __init__(self, broker: Broker, source: int, system: Any, cfg: Any) -> None:
        self.broker = broker
        self.id = Sender.count
        Sender.count += 1

    async def send(self, bodies: list[bytes]) -> None:
        await asyncio.sleep(0)
        for body in bodies:
            parsed = parse_body(body, SIZE)
            assert parsed is not None
            self.broker.log.append(("send", parsed[0], self.id))
            for q in self.broker.queues:
                q.put_nowait(body)

    async def close(self) -> None:
        pass


class Receiver:
    def __init__(self, broker: Broker, source: int, system: Any, cfg: Any) -> None:
        self.broker, self.source = broker, source

    async def receive(self, max_n: int, timeout: float) -> list[tuple[bytes, int]]:
        q = self.broker.queues[self.source]
        try:
            got = [await asyncio.wait_for(q.get(), timeout)]
        except TimeoutError:
            return []
        while len(got) < max_n and not q.empty():
            got.append(q.get_nowait())
        for body in got:
            parsed = parse_body(body, SIZE)
            self.broker.log.append(("recv", parsed[0] if parsed else None, self.source))
        self.broker.unsettled += len(got)
        return [(body, i) for i, body in enumerate(got)]

    async def settle(self, tokens: list[int]) -> None:
        self.broker.unsettled -= len(tokens)

    def stop(self) -> None:
        self.broker.stopped += 1

    async def close(self) -> None:
        self.broker.closed += 1


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The workers' answers (both roles run in this process), and the fake system installed."""
    emitted: list[str] = []
    monkeypatch.setattr(_worker, "emit", lambda **obj: emitted.append(obj["event"]))
    monkeypatch.setattr(
        _worker, "_peer", lambda system: SimpleNamespace(Sender=Sender, Receiver=Receiver)
    )
    monkeypatch.setitem(SYSTEMS, "fake", {"peer": "fake", "settle": "peek-lock"})
    return emitted


def _cell(senders: int, receivers: int, subscriptions: int, calls: str) -> dict[str, Any]:
    topology = {"subscriptions": subscriptions} if subscriptions else {}
    return {
        "topology": topology,
        "n": N,
        "size": SIZE,
        "calls": calls,
        "prefetch": 0,
        "senders": senders,
        "receivers": receivers,
    }


async def _until(events: list[str], event: str, count: int) -> None:
    while events.count(event) < count:
        await asyncio.sleep(0.001)


async def _run_cell(
    cell: dict[str, Any], events: list[str], *, tx_warmup: int | None = None
) -> tuple[Broker, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The suite's sequence: prepare both, ``warm`` both, wait for both ``warmed``, ``go``
    both. ``tx_warmup`` overrides the sender's count (to show a mismatch is caught)."""
    sources = max(1, cell["topology"].get("subscriptions", 0))
    broker = Broker(sources)
    rx_cmd, tx_cmd = suite.prepare_commands(cell, "fake", broker, 10, 3.0)
    if tx_warmup is not None:
        tx_cmd = {**tx_cmd, "warmup": tx_warmup}
    rx_lines: asyncio.Queue[bytes] = asyncio.Queue()
    tx_lines: asyncio.Queue[bytes] = asyncio.Queue()
    rx = asyncio.ensure_future(_worker.follow_steps(_worker.run_receivers, rx_cmd, rx_lines.get))
    tx = asyncio.ensure_future(_worker.follow_steps(_worker.run_senders, tx_cmd, tx_lines.get))
    try:
        await _until(events, "prepared", 2)
        for lines in (rx_lines, tx_lines):
            lines.put_nowait(json.dumps({"op": "warm"}).encode())
        warmed = asyncio.ensure_future(_until(events, "warmed", 2))
        await asyncio.wait({warmed, rx, tx}, return_when=asyncio.FIRST_COMPLETED)
        if rx.done() or tx.done():  # a worker failed while warming up
            warmed.cancel()
            await asyncio.gather(rx, tx)
        broker.log.append(("go",))
        for lines in (rx_lines, tx_lines):
            lines.put_nowait(json.dumps({"op": "go"}).encode())
        return broker, rx_cmd, await rx, await tx
    finally:
        rx.cancel()
        tx.cancel()


CELLS = [
    pytest.param(1, 1, 0, "single", id="queue-1x1-single"),
    pytest.param(32, 2, 0, "single", id="queue-32-senders"),
    pytest.param(2, 100, 0, "batch", id="queue-100-competing-receivers"),
    pytest.param(4, 10, 10, "batch", id="topic-10-subscriptions"),
    pytest.param(100, 3, 3, "single", id="topic-100-senders"),
]


@pytest.mark.parametrize(("senders", "receivers", "subscriptions", "calls"), CELLS)
def test_senders_and_receivers_agree_on_the_warm_up_and_time_only_after_it(
    events: list[str], senders: int, receivers: int, subscriptions: int, calls: str
) -> None:
    cell = _cell(senders, receivers, subscriptions, calls)
    broker, rx_cmd, got, sent = asyncio.run(_run_cell(cell, events))

    w = rx_cmd["warmup"]
    sources = rx_cmd["sources"]
    assert w >= max(senders, -(-receivers // sources))  # one per sender / competing receiver
    assert sorted(events) == ["prepared", "prepared", "warmed", "warmed"]
    go = broker.log.index(("go",))
    before, after = broker.log[:go], broker.log[go + 1 :]
    # The senders sent exactly the warm-up indexes (n..n+w-1), each once, all before "go",
    # from every sender endpoint; the timed indexes 0..n-1 only after it.
    warm_sends = sorted(i for kind, i, *_ in before if kind == "send")
    assert warm_sends == list(range(N, N + w))
    assert len({sender for kind, _i, sender in before if kind == "send"}) == senders
    assert sorted(i for kind, i, *_ in after if kind == "send") == list(range(N))
    # Every source received and settled all the warm-up messages before "go", none after.
    for src in range(sources):
        warm_got = sorted(i for kind, i, s in before if kind == "recv" and s == src)
        assert warm_got == list(range(N, N + w))
        assert all(i < N for kind, i, s in after if kind == "recv" and s == src)
    # And the timed run is whole: nothing of the warm-up was left over to be received in it.
    assert got["problems"] == []
    assert got["received"] == N * sources and sent["sent"] == N
    assert broker.unsettled == 0


@pytest.mark.parametrize("tx_warmup", [-1, +1], ids=["sender-sends-fewer", "sender-sends-more"])
def test_a_warm_up_count_mismatch_fails_the_run(events: list[str], tx_warmup: int) -> None:
    """The test above would notice the old bug: receivers waiting for more warm-up messages
    than were sent never finish warming up; an extra one is refused as not a warm-up message
    (or, had the receivers finished first, spoils the timed run)."""
    cell = _cell(2, 2, 0, "single")
    w = suite.prepare_commands(cell, "fake", None, 10, 3.0)[0]["warmup"]
    try:
        _broker, _rx, got, _sent = asyncio.run(_run_cell(cell, events, tx_warmup=w + tx_warmup))
    except TimeoutError:
        assert tx_warmup < 0  # the receivers waited for a warm-up message never sent
    except RuntimeError as exc:
        assert tx_warmup > 0 and "not a warm-up one" in str(exc)
    else:
        assert tx_warmup > 0 and got["problems"]


def test_a_command_out_of_order_stops_the_role(events: list[str]) -> None:
    """``go`` before ``warm``: the worker refuses rather than time a cold run."""
    cell = _cell(1, 1, 0, "single")
    broker = Broker(1)
    _rx, tx_cmd = suite.prepare_commands(cell, "fake", broker, 10, 3.0)

    async def go_first() -> bytes:
        return json.dumps({"op": "go"}).encode()

    with pytest.raises(RuntimeError, match="expected warm"):
        asyncio.run(_worker.follow_steps(_worker.run_senders, tx_cmd, go_first))
    assert broker.log == []  # nothing sent


def test_more_rounds_get_a_proportionally_larger_time_budget() -> None:
    """Three rounds of the full profile within one round's budget cut the last cells short."""
    one, three = suite.parse_args([]), suite.parse_args(["--rounds", "3"])
    assert three.budget == 3 * one.budget and three.rounds == 3
    assert suite.parse_args(["--rounds", "3", "--budget", "50"]).budget == 50
    assert suite.parse_args(["--quick"]).budget < one.budget


def test_competing_receivers_still_waiting_at_the_end_are_not_timed(
    events: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the last message is settled, the competing receivers still waiting in a receive
    stop waiting: the run's end is the closes right after, not their waits running out (every
    system's 8-receiver cells counted up to one wait, 0.2 s, that was not the system's)."""
    monkeypatch.setattr(_worker, "RECEIVE_WAIT_S", 60.0)
    cell = _cell(1, 8, 0, "batch")
    broker, _rx, got, _sent = asyncio.run(asyncio.wait_for(_run_cell(cell, events), 30))

    assert got["problems"] == [] and got["received"] == N and broker.unsettled == 0
    assert got["t_settled"] <= got["t_end"] < got["t_settled"] + 5  # not the 60 s wait
    assert broker.stopped >= 1  # those waiting were told first (a thread's receive needs it)
    assert broker.closed == 8  # and every endpoint was closed before the end was taken
