"""``complete_messages`` in steps, so the sync API can run them with a blocking call between.

The asyncio receiver awaits one settle call per partition; the sync receiver, on a queue of one
partition whose route is cached, makes that call from the caller's own thread (profiled: the
hop through the background loop took a fifth of a receiver's samples). Both share the
validation before the call and the bookkeeping after it, here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._core.partition import COMPLETE, SettleOp
from ._refusal import Failure, refusal

if TYPE_CHECKING:
    from ..message import ServiceBusReceivedMessage
    from ._receiver import ServiceBusReceiver

__all__ = ["Failures", "Items", "apply_results", "plan", "raise_failures"]

Items = list[tuple["ServiceBusReceivedMessage", SettleOp]]
Failures = list[Failure]


def plan(
    receiver: ServiceBusReceiver, messages: Sequence[ServiceBusReceivedMessage]
) -> dict[int, Items]:
    """Validate every message (raising before anything is sent) and group the completions by
    partition; marks nothing."""
    from ._receiver import lock_token_of  # here: _receiver imports this module

    by_partition: dict[int, Items] = {}
    for msg in messages:
        op = receiver._settle_op(msg, SettleOp(COMPLETE, lock_token_of(msg)))
        by_partition.setdefault(msg.partition_id, []).append((msg, op))
    return by_partition


def wire(items: Items) -> list[tuple[Any, ...]]:
    """Mark the messages settled (a concurrent second settlement is refused locally) and
    return the ops of one settle call."""
    for msg, _op in items:
        # Through __dict__: a message's __setattr__ (which drops its validated record, for
        # fields a sender may change) cost more than the rest of this loop.
        msg.__dict__["_settled"] = True
    return [op.to_wire() for _, op in items]


def apply_results(items: Items, results: Sequence[Any] | BaseException, failures: Failures) -> None:
    """Record one settle call's outcome: an error per op, or the exception of the whole call
    (outcome unknown: the messages may be settled again)."""
    if isinstance(results, BaseException):
        for msg, _op in items:
            msg._settled = False
            failures.append((msg.sequence_number, msg.lock_token, results))
        return
    for (msg, _op), err in zip(items, results, strict=True):
        if err is not None:
            msg._settled = False
            failures.append((msg.sequence_number, msg.lock_token, err))


def raise_failures(
    entity: str, failures: Failures, total: int, earlier: Sequence[Failure] = ()
) -> None:
    """Raise one refusal for this call's ``failures`` of ``total`` completions and the
    ``earlier`` settlements sent without waiting that the broker refused, if any."""
    if not failures and not earlier:
        return
    text = f"{len(failures)} of {total} completions were refused"
    if earlier:
        text += (
            f", and {len(earlier)} settlement(s) sent earlier without waiting; those messages"
            " were not settled and will be delivered again"
        )
    raise refusal(text, entity, [*earlier, *failures])
