"""``call_self_until_answered``: an actor's call to itself is made again until answered."""

from __future__ import annotations

from typing import Any

from raybus._actors.self_call import call_self_until_answered


def test_the_call_is_made_again_after_failures_and_timeouts_until_one_is_answered() -> None:
    calls: list[int] = []
    outcomes: list[BaseException | None] = [RuntimeError("actor restarting"), TimeoutError(), None]
    timeouts: list[float] = []

    def call() -> int:
        calls.append(len(calls))
        return calls[-1]

    def get(ref: int, timeout: float) -> Any:
        timeouts.append(timeout)
        outcome = outcomes[ref]
        if outcome is not None:
            raise outcome
        return "answered"

    thread = call_self_until_answered(call, "test", timeout_s=7.0, pause_s=0.01, get=get)
    thread.join(5)
    assert not thread.is_alive() and thread.daemon
    assert calls == [0, 1, 2] and timeouts == [7.0, 7.0, 7.0]  # none after the answer


def test_an_answered_first_call_is_made_once() -> None:
    calls: list[None] = []
    thread = call_self_until_answered(
        lambda: calls.append(None), "test", get=lambda ref, timeout: None
    )
    thread.join(5)
    assert not thread.is_alive() and len(calls) == 1
