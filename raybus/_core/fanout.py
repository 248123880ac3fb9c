"""Fan-out planning for a topic: which copies of which messages go to which subscription.

Pure; the router actor (``raybus._actors.router``) runs it on each batch of published
messages and then delivers every subscription partition's copies in one call. Copy semantics
are Service Bus's (``raybus._core.filters.fan_out``): the rules of a subscription that have no
action are OR-ed into one copy; every matching rule with an action gives its own copy, changed
by the action and carrying the property ``RuleName`` (and, for a subscription's duplicate
detection, ``copy_of``: ``raybus._core.slots.dedup_id``). A rule that fails to evaluate sends the
message to that subscription's dead-letter sub-queue (reason: the error's type name) when the
subscription dead-letters filter errors, and drops it for that subscription otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..exceptions import ServiceBusError
from .filters import RuleProperties, fan_out
from .record import ARRIVE_DEAD_LETTERED, MessageRecord, encoded_size, snapshot
from .slots import rule_copy_id

__all__ = ["Target", "plan"]

RULE_NAME_PROPERTY = "RuleName"


@dataclass(frozen=True)
class Target:
    """One subscription as the router sees it."""

    name: str
    path: str
    rules: tuple[RuleProperties, ...]
    dead_letter_on_filter_errors: bool = True


def plan(
    targets: Sequence[Target], records: Sequence[MessageRecord]
) -> dict[str, list[MessageRecord]]:
    """The copies each subscription (by path) receives, in publish order.

    A copy no rule action changed is the published record itself (the same object in every
    subscription's list): callers must treat the copies as read-only.
    """
    out: dict[str, list[MessageRecord]] = {}
    for target in targets:
        copies: list[MessageRecord] = []
        for rec in records:
            matches, error = fan_out(target.rules, rec)
            if error is not None:
                if target.dead_letter_on_filter_errors:
                    dead = snapshot(rec)
                    dead.state = ARRIVE_DEAD_LETTERED
                    dead.dead_letter_reason = error.type_name
                    dead.dead_letter_error_description = str(error)
                    copies.append(dead)
                continue
            for rule_name, action in matches:
                if action is None:
                    # Unchanged copies share the record: the router only reads and serialises
                    # them (each partition deserialises its own), and shares of equal content
                    # can then be recognised and serialised once.
                    copies.append(rec)
                    continue
                copy = snapshot(rec)
                copy_of = rule_copy_id(rec, rule_name)  # its duplicates: this rule's copies
                try:
                    action.apply(copy)
                    props = dict(copy.application_properties or {})
                    props[RULE_NAME_PROPERTY] = rule_name
                    copy.application_properties = props
                    encoded_size(copy)
                except ServiceBusError as exc:  # the action made it invalid
                    if not target.dead_letter_on_filter_errors:
                        continue
                    copy = snapshot(rec)
                    copy.state = ARRIVE_DEAD_LETTERED
                    copy.dead_letter_reason = getattr(exc, "type_name", type(exc).__name__)
                    copy.dead_letter_error_description = str(exc)
                copy.copy_of = copy_of
                copies.append(copy)
        if copies:
            out[target.path] = copies
    return out
