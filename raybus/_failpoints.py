"""Named fail points: places where a test can make an actor fail on purpose.

A test arms a point in a running actor (``arm_failpoint`` on every guarded actor); the next time
the actor's code passes that point it fails: with ``mode="exit"`` (the default) its process
exits at once, as a crash would; with ``mode="raise"`` the call raises ``FailPointError`` and
the actor goes on (a call that fails while the actor stays up). A point fires once (a restarted
process starts with nothing armed). Nothing is armed outside tests, and an unarmed point costs a
dictionary lookup.

Points: ``participant.before_prepare``, ``participant.after_prepare`` (durable, before
answering), ``participant.before_commit``, ``participant.after_commit`` (durable, before
answering), ``coordinator.before_decision``, ``coordinator.after_decision`` (logged, before
any participant is told), ``access.before_set_access`` (a pushed rule change, before it is
applied), ``router.after_log`` (a publish logged, before any partition is told),
``router.after_ack`` (a partition stored its copies of a logged publish; others may not have),
``participant.before_deliver``, ``participant.after_deliver`` (a partition stored a logged
publish's copies, durable, before answering).
"""

from __future__ import annotations

import logging
import os

from .exceptions import InvalidArgumentError

__all__ = ["FailPointError", "arm", "hit"]

_MODES = ("exit", "raise")
_armed: dict[str, str] = {}  # point -> mode
_log = logging.getLogger("raybus.failpoints")


class FailPointError(RuntimeError):
    """A fail point armed with ``mode="raise"`` fired (tests only): the call failed on purpose
    and changed nothing past the point. Nothing to do: the test expects it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def arm(name: str, mode: str = "exit") -> None:
    if mode not in _MODES:
        raise InvalidArgumentError(
            f"mode must be one of {', '.join(_MODES)}, not {mode!r}", None, "mode"
        )
    _armed[name] = mode


def hit(name: str) -> None:
    """Fail now (see the module docstring) if ``name`` is armed."""
    mode = _armed.pop(name, None)
    if mode is None:
        return
    _log.warning("fail point %s: %s", name, mode)
    if mode == "raise":
        raise FailPointError(name)
    os._exit(1)
