"""The AMQP gateway's sending links count credit as AMQP 1.0 says (no Ray, no sockets)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raybus.amqp._links import OutgoingLink


class _Session:
    def __init__(self) -> None:
        self.conn = SimpleNamespace(gateway=None)
        self.flows: list[dict[str, Any]] = []

    def flow(self, **fields: Any) -> None:
        self.flows.append(fields)


def _link() -> tuple[OutgoingLink, _Session]:
    session = _Session()
    return OutgoingLink(session, {"name": "l", "handle": 0}), session  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ours", "theirs", "granted", "credit"),
    [
        (5, 5, 3, 3),  # the peer has seen every transfer
        (5, 3, 3, 1),  # two transfers still on their way to it
        (9, 5, 1, 0),  # it lags by more than it grants (it missed our drain's flow)
        (2, 0xFFFFFFFF, 4, 1),  # the counts wrap around 2**32
        (5, 5, 0, 0),
    ],
)
def test_credit_is_what_the_peer_granted_past_what_was_sent_never_negative(
    ours: int, theirs: int, granted: int, credit: int
) -> None:
    link, _ = _link()
    link.delivery_count = ours
    link.on_flow({"delivery_count": theirs, "link_credit": granted})  # type: ignore[arg-type]
    assert link.credit == credit
    assert link.credit_ready.is_set() == (credit > 0)


def test_a_drain_with_nothing_to_send_uses_up_the_credit_and_says_so() -> None:
    link, session = _link()
    link.on_flow({"delivery_count": 0, "link_credit": 4, "drain": True})  # type: ignore[arg-type]
    link.drained()
    assert (link.credit, link.delivery_count) == (0, 4)
    assert session.flows == [{"handle": 0, "delivery_count": 4, "link_credit": 0, "drain": True}]
    # The peer asks again with its old count (azure-servicebus ignores our flow): no credit.
    link.on_flow({"delivery_count": 0, "link_credit": 1})  # type: ignore[arg-type]
    assert link.credit == 0 and not link.credit_ready.is_set()
