"""The history checker (tests/helpers/history.py) finds each anomaly it names in a synthetic
history, and finds none in a clean one. No Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from history import (
    Anomaly,
    Fault,
    Final,
    History,
    Receive,
    Release,
    Send,
    Settle,
    Txn,
    check,
    outcome_of,
)

from raybus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    SettlementFailedError,
    TransactionAbortedError,
)

Q = "q"


def send(mid: str, t: float = 0.0, outcome: str = "ok", txn: str | None = None) -> Send:
    return Send((mid,), Q, outcome, t, t + 0.01, txn, (None,))


def recv(
    mid: str,
    t: float,
    token: str,
    *,
    until: float | None = None,
    seq: int = 1,
    receiver: str = "r1",
    session: str | None = None,
    source: str = "active",
    dc: int = 0,
) -> Receive:
    return Receive(
        mid,
        Q,
        seq,
        token,
        t + 5 if until is None else until,
        dc,
        session,
        receiver,
        t,
        t + 0.01,
        0,
        source,
    )


def settle(
    mid: str, token: str, op: str, t: float, outcome: str = "ok", txn: str | None = None
) -> Settle:
    return Settle(mid, token, op, outcome, t, t + 0.01, "r1", txn)


def final(mid: str, state: str = "active", reason: str | None = None, dc: int = 0) -> Final:
    return Final(mid, Q, state, 1, dc, reason)


def kinds(anomalies: list[Anomaly]) -> list[str]:
    return sorted(a.kind for a in anomalies)


def clean_history() -> list[object]:
    """A small history exercising every event type with nothing wrong."""
    return [
        send("a", 0),
        recv("a", 1, "t1"),
        settle("a", "t1", "complete", 2),
        send("b", 0),
        recv("b", 1, "t2", until=3),
        recv("b", 4, "t3", dc=1),  # lock expired
        settle("b", "t3", "abandon", 5),
        recv("b", 6, "t4", dc=2),
        settle("b", "t4", "dead_letter", 7),
        send("c", 0),
        recv("c", 1, "t5"),
        settle("c", "t5", "defer", 2),
        recv("c", 3, "t6", source="deferred"),
        settle("c", "t6", "complete", 4),
        send("d", 0, outcome="failed"),
        send("e", 0, outcome="unknown"),
        final("e"),
        send("f", 0, txn="x1"),
        send("g", 0, txn="x2"),
        Txn("x1", "committed", 0, 1),
        Txn("x2", "aborted", 0, 1),
        final("f"),
        send("h", 0),
        recv("h", 1, "t7"),
        Fault("kill", 1.5, 1.6, Q),
        recv("h", 2, "t8"),
        send("i", 0),
        recv("i", 1, "t9", receiver="r9"),
        Release("r9", 1.2),
        recv("i", 1.5, "t10"),
        final("i"),
        send("s1", 0),
        send("s2", 0),
        recv("s1", 1, "u1", seq=1, session="S"),
        recv("s2", 1.1, "u2", seq=2, session="S"),
        settle("s1", "u1", "abandon", 1.2),
        recv("s1", 1.3, "u3", seq=1, session="S"),
        final("s1"),
        final("s2"),
        final("b", "dead_letter", "poison"),
        final("h"),
        send("m", 0),
        final("m", "dead_letter", "MaxDeliveryCountExceeded", dc=9),
    ]  # type: ignore[list-item]


def test_clean_history_has_no_anomalies() -> None:
    assert check(clean_history()) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([send("a", 0)], ["LOST"], id="lost"),
        pytest.param(
            [send("a", 0), recv("a", 1, "t"), settle("a", "t", "abandon", 2)],
            ["LOST"],
            id="lost-after-abandon",
        ),
        pytest.param([send("a", 0, "failed"), recv("a", 1, "t")], ["PHANTOM"], id="phantom"),
        pytest.param(
            [send("a", 0, txn="x"), Txn("x", "aborted", 0, 1), final("a")],
            ["PHANTOM"],
            id="aborted-send-appears",
        ),
        pytest.param(
            [send("a", 0, txn="x"), Txn("x", "committed", 0, 1)],
            ["LOST"],
            id="committed-send-missing",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t", until=2),
                settle("a", "t", "complete", 1.5),
                recv("a", 3, "t2"),
            ],
            ["DELIVERED_AFTER_SETTLE"],
            id="redelivered-after-complete",
        ),
        pytest.param(
            [send("a", 0), recv("a", 1, "t"), settle("a", "t", "complete", 2), final("a")],
            ["DELIVERED_AFTER_SETTLE"],
            id="completed-still-stored",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t", until=2),
                settle("a", "t", "dead_letter", 1.5),
                recv("a", 3, "t2"),
                final("a", "dead_letter", "x"),
            ],
            ["DELIVERED_AFTER_SETTLE"],
            id="redelivered-after-dead-letter",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t", until=2),
                settle("a", "t", "defer", 1.5),
                recv("a", 3, "t2"),
                final("a", "deferred"),
            ],
            ["DELIVERED_AFTER_SETTLE"],
            id="deferred-received-normally",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t1", until=2),
                recv("a", 3, "t2", receiver="r2"),
                settle("a", "t1", "complete", 3.5),
                settle("a", "t2", "complete", 3.6),
            ],
            ["DOUBLE_COMPLETE"],
            id="stale-lock-complete-accepted",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t1", until=10),
                recv("a", 2, "t2", receiver="r2"),
                final("a"),
            ],
            ["DOUBLE_LOCK"],
            id="double-lock",
        ),
        pytest.param(
            [
                send("a", 0),
                recv("a", 1, "t1", until=10),
                Fault("kill", 5, 6, "other"),
                recv("a", 7, "t2", receiver="r2"),
                final("a"),
            ],
            ["DOUBLE_LOCK"],
            id="fault-elsewhere-does-not-excuse",
        ),
        pytest.param(
            [
                send("a", 0),
                send("b", 0),
                recv("b", 1, "t1", seq=2, session="S"),
                recv("a", 2, "t2", seq=1, session="S"),
                final("a"),
                final("b"),
            ],
            ["SESSION_ORDER"],
            id="session-order",
        ),
        pytest.param(
            [send("a", 0, txn="x"), send("b", 0, txn="x"), Txn("x", "unknown", 0, 1), final("a")],
            ["TXN_PARTIAL"],
            id="txn-partial-unknown",
        ),
        pytest.param(
            [send("a", 0, txn="x"), send("b", 0, txn="x"), Txn("x", "committed", 0, 1), final("a")],
            ["LOST", "TXN_PARTIAL"],
            id="txn-partial-committed",
        ),
        pytest.param(
            [
                send("c", 0),
                recv("c", 0.1, "t", until=9),
                settle("c", "t", "complete", 0.2, "txn", "x"),
                send("a", 0.3, txn="x"),
                Txn("x", "committed", 0.4, 1),
                final("a"),
                final("c"),
            ],
            ["TXN_COMPLETE_UNDONE"],
            id="txn-complete-undone",
        ),
        pytest.param(
            [
                send("c", 0),
                recv("c", 0.1, "t", until=0.5),
                settle("c", "t", "complete", 0.2, "txn", "x"),
                Txn("x", "aborted", 0.4, 1),
            ],
            ["LOST"],
            id="aborted-txn-complete-took-effect",
        ),
        pytest.param(
            [send("a", 0), final("a", "dead_letter", "poison")],
            ["DLQ_UNEXPLAINED"],
            id="dlq-unexplained",
        ),
        pytest.param(
            [send("a", 0), final("a", "dead_letter", "MaxDeliveryCountExceeded", dc=2)],
            ["DLQ_UNEXPLAINED"],
            id="dlq-max-count-too-early",
        ),
        pytest.param(
            [send("a", 0), recv("a", 1, "t"), settle("a", "t", "dead_letter", 2), final("a")],
            ["DLQ_MISSING"],
            id="dlq-missing",
        ),
        pytest.param(
            [send("a", 0), final("a"), final("a")],
            ["DUPLICATE_STORED"],
            id="duplicate-stored",
        ),
    ],
)
def test_injected_anomaly_is_found(events: list[object], expected: list[str]) -> None:
    found = check(events)  # type: ignore[arg-type]
    assert kinds(found) == expected, [str(a) for a in found]
    for a in found:
        assert a.evidence, f"{a} carries no evidence"


def test_a_waiting_receive_that_started_first_may_be_granted_second() -> None:
    """Seen in the soak: r2's receive waited from 1.0 to 2.5 and got the message after r1
    (receive 1.5-1.6) abandoned it at 2.4: one lock after the other, not two at once."""
    events = [
        send("a", 0),
        Receive("a", Q, 1, "t2", 7.5, 1, None, "r2", 1.0, 2.5),
        Receive("a", Q, 1, "t1", 6.5, 0, None, "r1", 1.5, 1.6),
        Settle("a", "t1", "abandon", "ok", 2.4, 2.45, "r1"),
        final("a"),
    ]
    assert check(events) == []  # type: ignore[arg-type]
    overlapping = [*events[:3], final("a")]  # r1 never let go: both held it at 2.5
    assert kinds(check(overlapping)) == ["DOUBLE_LOCK"]  # type: ignore[arg-type]


def test_an_injected_anomaly_in_the_clean_history_is_found_among_the_rest() -> None:
    events = clean_history()
    events.append(recv("a", 9, "late"))  # "a" was completed at 2
    (found,) = check(events)  # type: ignore[arg-type]
    assert found.kind == "DELIVERED_AFTER_SETTLE" and found.subject == "a"


def test_failed_settlement_does_not_count_as_complete() -> None:
    events = [send("a", 0), recv("a", 1, "t"), settle("a", "t", "complete", 2, "failed")]
    assert kinds(check(events)) == ["LOST"]  # type: ignore[arg-type]


def test_unknown_complete_may_or_may_not_have_happened() -> None:
    gone = [send("a", 0), recv("a", 1, "t"), settle("a", "t", "complete", 2, "unknown")]
    there = [*gone, final("a")]
    assert check(gone) == [] and check(there) == []  # type: ignore[arg-type]


def test_outcome_of_classifies_refusals_as_failed_and_lost_connections_as_unknown() -> None:
    assert outcome_of(MessageLockLostError("lost", Q)) == "failed"
    assert outcome_of(TransactionAbortedError("no", Q)) == "failed"
    assert outcome_of(ServiceBusConnectionError("gone", Q)) == "unknown"
    assert outcome_of(OperationTimeoutError("slow", Q)) == "unknown"
    assert outcome_of(RuntimeError("?")) == "unknown"
    lock = SettlementFailedError("x", Q, [(1, "t", "MessageLockLostError: lock lost")])
    died = SettlementFailedError("x", Q, [(1, "t", "actor died")])
    assert outcome_of(lock) == "failed" and outcome_of(died) == "unknown"


def test_recorder_streams_json_lines_that_load_back(tmp_path: Path) -> None:
    sink = tmp_path / "h.jsonl"
    h = History(sink)
    with h.sending(Q, ["a", "b"], sessions=[None, None]):
        pass
    with pytest.raises(ServiceBusConnectionError), h.sending(Q, ["c"]):
        raise ServiceBusConnectionError("gone", Q)
    h.add(Release("r", 1.0))
    h.close()
    with sink.open("a") as f:
        f.write('{"kind": "send", "mi')  # a torn last line from a killed process
    loaded = History.load_jsonl(sink)
    assert [(type(e).__name__, getattr(e, "outcome", "")) for e in loaded] == [
        ("Send", "pending"),
        ("Send", "ok"),
        ("Send", "pending"),
        ("Send", "unknown"),
        ("Release", ""),
    ]
    assert loaded == h.events
    assert json.loads(sink.read_text().splitlines()[0])["mids"] == ["a", "b"]
    assert kinds(check(loaded)) == ["LOST", "LOST"]  # a, b acknowledged, never drained


def test_a_call_cut_short_by_a_kill_counts_as_unknown(tmp_path: Path) -> None:
    """A consumer process killed mid-complete leaves only the "pending" record: the message
    may be gone, and that is not a loss; a finished call's pending record is superseded."""

    class Msg:
        message_id, lock_token = "a", "t"

    sink = tmp_path / "h.jsonl"
    h = History(sink)
    h.add(send("a", 0))
    h.add(recv("a", 1, "t"))
    with h.settling(Msg(), "abandon", receiver="r1"):
        pass
    h.add(Settle("a", "t", "complete", "pending", 3, 3, "r1"))  # killed during this call
    h.close()
    loaded = History.load_jsonl(sink)
    assert [getattr(e, "outcome", None) for e in loaded].count("pending") == 2
    assert check(loaded) == []  # type: ignore[arg-type]
    finished = [e for e in loaded if not (isinstance(e, Settle) and e.op == "complete")]
    assert kinds(check(finished)) == ["LOST"]  # type: ignore[arg-type]
