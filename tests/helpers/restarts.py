"""Killing a broker actor and knowing when its successor answers.

``ray.kill`` returns before the old process has died, and until it has, the old actor still
answers: a test that acts at once may be answered by the process about to die (a receive it
answered, then a complete that reached the successor, is refused). So a successor is known by
its process id: a new one answering means the old process is gone.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray


def process_id(handle: Any) -> int | None:
    """The process id of the actor behind ``handle``, or None while it restarts."""
    try:
        pid: int = ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=5)
    except ray.exceptions.RayError:
        return None
    return pid


def wait_for_successor(handle: Any, before: int | None, timeout: float = 60.0) -> None:
    """Wait until the actor answers from a process other than ``before`` (``process_id``)."""
    _wait_changed(handle, before, time.monotonic() + timeout)


def _wait_changed(handle: Any, before: int | None, deadline: float) -> None:
    while process_id(handle) in (None, before):
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)


def restart(handle: Any, timeout: float = 60.0) -> None:
    """Kill the actor (Ray restarts it) and wait until its successor answers."""
    restart_all([handle], timeout)


def restart_all(handles: list[Any], timeout: float = 60.0) -> None:
    """Kill every actor of ``handles`` at once (Ray restarts each) and wait until each one's
    successor answers (from a process other than the one killed)."""
    before = [process_id(h) for h in handles]
    for handle in handles:
        ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + timeout
    for handle, old in zip(handles, before, strict=True):
        _wait_changed(handle, old, deadline)
