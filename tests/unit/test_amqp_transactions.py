"""The AMQP gateway's transaction bookkeeping (``raybus.amqp._transactions``) against fake
raybus clients: declare / discharge, discharge waiting for the work that came before it,
rollback-only after a failed operation, unknown ids; and the frames it reads (no Ray)."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from raybus.amqp._codec import Described, Symbol, ULong
from raybus.amqp._errors import TransactionUnknownError, condition_of
from raybus.amqp._frames import (
    as_performative,
    described_list,
    is_coordinator,
    transactional,
    transactional_answer,
)
from raybus.amqp._links import Outcome
from raybus.amqp._transactions import Transactions
from raybus.enums import ServiceBusDisposition
from raybus.exceptions import (
    MessageSizeExceededError,
    TransactionAbortedError,
    TransactionTimeoutError,
)


class _RaybusTxn:
    def __init__(self, refuse: BaseException | None = None) -> None:
        self.state, self.refuse = "open", refuse

    async def commit(self) -> None:
        if self.refuse is not None:
            self.state = "rolled back"
            raise self.refuse
        self.state = "committed"

    async def rollback(self) -> None:
        self.state = "rolled back"


class _Client:
    def __init__(self, refuse: BaseException | None = None) -> None:
        self.made: list[_RaybusTxn] = []
        self.refuse = refuse

    def transaction(self) -> _RaybusTxn:
        self.made.append(_RaybusTxn(self.refuse))
        return self.made[-1]


class _Sender:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.sent: list[tuple[list[Any], Any]] = []
        self.fail = fail

    async def send_messages(self, messages: list[Any], *, transaction: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append((messages, transaction))


class _Receiver:
    entity_path = "q"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def complete_message(self, message: Any, *, transaction: Any) -> None:
        self.calls.append(("complete", message))

    async def dead_letter_message(self, message: Any, *args: Any, transaction: Any) -> None:
        self.calls.append(("dead_letter", args))


class _Conn:
    id = "c1"

    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, token: str) -> None:
        self.released.append(token)


def _outcome(answer: Described) -> tuple[str, str | None]:
    """(outcome name, error condition) of a discharge's answer."""
    perf = as_performative(answer)
    err = perf.get("error")
    return perf.name, None if err is None else str(as_performative(err).get("condition"))


def test_commit_applies_sends_and_settlements_and_releases_their_locks() -> None:
    async def scenario() -> None:
        txns, conn, client, sender, receiver = (
            Transactions(),
            _Conn(),
            _Client(),
            _Sender(),
            _Receiver(),
        )
        txn = txns.declare()
        message = SimpleNamespace(lock_token="tok")
        await txn.send(client, sender, ["m"])  # type: ignore[arg-type]
        await txn.settle(
            client,  # type: ignore[arg-type]
            receiver,  # type: ignore[arg-type]
            message,
            Outcome(ServiceBusDisposition.DEAD_LETTERED, None, "why", "how"),
        )
        assert len(client.made) == 1  # one raybus transaction for all its operations
        assert sender.sent == [(["m"], client.made[0])]
        assert receiver.calls == [("dead_letter", ("why", "how", None))]
        answer = await txns.discharge(conn, txn.id, fail=False)  # type: ignore[arg-type]
        assert _outcome(answer) == ("accepted", None)
        assert client.made[0].state == "committed" and conn.released == ["tok"]
        assert txn.id not in txns.declared

    asyncio.run(scenario())


def test_discharge_waits_for_transactional_work_that_arrived_before_it() -> None:
    async def scenario() -> None:
        txns, client, sender = Transactions(), _Client(), _Sender()
        txn = txns.declare()
        gate = asyncio.Event()

        async def late_send() -> None:  # a transfer still being handled at the discharge
            await gate.wait()
            await txn.send(client, sender, ["late"])  # type: ignore[arg-type]

        txns.track(asyncio.ensure_future(late_send()))
        discharge = asyncio.ensure_future(txns.discharge(_Conn(), txn.id, fail=False))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert not discharge.done()
        gate.set()
        assert _outcome(await discharge) == ("accepted", None)
        assert sender.sent and client.made[0].state == "committed"

    asyncio.run(scenario())


def test_a_failed_operation_makes_the_commit_roll_back() -> None:
    async def scenario() -> None:
        txns, client, conn = Transactions(), _Client(), _Conn()
        txn = txns.declare()
        await txn.send(client, _Sender(), ["ok"])  # type: ignore[arg-type]
        with pytest.raises(MessageSizeExceededError):
            await txn.send(client, _Sender(MessageSizeExceededError("big", "q")), ["x"])  # type: ignore[arg-type]
        answer = await txns.discharge(conn, txn.id, fail=False)  # type: ignore[arg-type]
        assert _outcome(answer) == ("rejected", "amqp:transaction:rollback")
        assert client.made[0].state == "rolled back" and conn.released == []

    asyncio.run(scenario())


def test_released_cannot_join_and_dooms_the_transaction() -> None:
    async def scenario() -> None:
        txns, client = Transactions(), _Client()
        txn = txns.declare()
        with pytest.raises(ValueError, match="released"):
            await txn.settle(
                client,  # type: ignore[arg-type]
                _Receiver(),  # type: ignore[arg-type]
                SimpleNamespace(lock_token="t"),
                Outcome(ServiceBusDisposition.RELEASED),
            )
        answer = await txns.discharge(_Conn(), txn.id, fail=False)  # type: ignore[arg-type]
        assert _outcome(answer)[0] == "rejected"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("refusal", "condition"),
    [
        (TransactionAbortedError("lock lost", None, "t", "prepare"), "amqp:transaction:rollback"),
        (TransactionTimeoutError("too slow", None, "t", "timeout"), "amqp:transaction:timeout"),
    ],
)
def test_a_refused_commit_is_answered_with_its_condition(
    refusal: BaseException, condition: str
) -> None:
    async def scenario() -> None:
        txns, client = Transactions(), _Client(refusal)
        txn = txns.declare()
        await txn.send(client, _Sender(), ["m"])  # type: ignore[arg-type]
        answer = await txns.discharge(_Conn(), txn.id, fail=False)  # type: ignore[arg-type]
        assert _outcome(answer) == ("rejected", condition)

    asyncio.run(scenario())


def test_rollback_and_unknown_ids() -> None:
    async def scenario() -> None:
        txns, client = Transactions(), _Client()
        txn = txns.declare()
        await txn.send(client, _Sender(), ["m"])  # type: ignore[arg-type]
        assert _outcome(await txns.discharge(_Conn(), txn.id, fail=True)) == ("accepted", None)  # type: ignore[arg-type]
        assert client.made[0].state == "rolled back"
        again = await txns.discharge(_Conn(), txn.id, fail=False)  # type: ignore[arg-type]
        assert _outcome(again) == ("rejected", "amqp:transaction:unknown-id")
        for bad in (b"nope", "a string", None):
            with pytest.raises(TransactionUnknownError):
                txns.get(bad)
        left = txns.declare()
        await left.send(client, _Sender(), ["n"])  # type: ignore[arg-type]
        await txns.close()  # the connection went away undischarged
        assert client.made[1].state == "rolled back" and not txns.declared

    asyncio.run(scenario())


def test_transaction_frames_are_recognised() -> None:
    coordinator = Described(ULong(0x30), [[Symbol("amqp:local-transactions")]])
    assert is_coordinator(coordinator)
    assert is_coordinator(Described(Symbol("amqp:coordinator:list"), []))
    assert not is_coordinator(described_list("target", address="q"))
    accepted = described_list("accepted")
    state = transactional_answer(b"id", accepted)
    assert transactional(state) == (b"id", accepted)
    assert transactional(Described(Symbol("amqp:transactional-state:list"), [b"x"])) == (
        b"x",
        None,
    )
    assert transactional(accepted) is None and transactional(None) is None


def test_transaction_unknown_error_pickles_and_maps_to_its_condition() -> None:
    err = TransactionUnknownError("no such transaction", "q", "txn-id")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is TransactionUnknownError and str(again) == str(err)
    assert condition_of(again) == "amqp:transaction:unknown-id"
