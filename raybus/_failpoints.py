"""Named fail points: places where a test can make an actor's process die on purpose.

A test arms a point in a running actor (``arm_failpoint`` on the partition and coordinator
actors); the next time the actor's code passes that point, its process exits at once, as a
crash would. A point fires once (the restarted process starts with nothing armed). Nothing is
armed outside tests, and an unarmed point costs a set lookup.

Points: ``participant.before_prepare``, ``participant.after_prepare`` (durable, before
answering), ``participant.before_commit``, ``participant.after_commit`` (durable, before
answering), ``coordinator.before_decision``, ``coordinator.after_decision`` (logged, before
any participant is told), ``partition.before_flush`` (a partition's next write of its log,
before anything of it is written).
"""

from __future__ import annotations

import logging
import os

__all__ = ["arm", "hit"]

_armed: set[str] = set()
_log = logging.getLogger("raybus.failpoints")


def arm(name: str) -> None:
    _armed.add(name)


def hit(name: str) -> None:
    """Exit this process now if ``name`` is armed."""
    if name in _armed:
        _armed.discard(name)
        _log.warning("fail point %s: exiting", name)
        os._exit(1)
