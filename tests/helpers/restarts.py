"""Killing a broker actor and knowing when its successor answers.

``ray.kill`` returns before the old process has died, and until it has, the old actor still
answers: a test that acts at once may be answered by the process about to die (a receive it
answered, then a complete that reached the successor, is refused). A partition actor's lane
address names its process, so a new address means the successor is up; any actor's process
id says the same (``restart_all``).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import ray


def lane_address(handle: Any) -> str | None:
    """The actor's lane address (it names the actor's process), or None while it restarts."""
    try:
        address: str = ray.get(handle.lane_address.remote(), timeout=5)[1]
    except ray.exceptions.RayError:
        return None
    return address


def wait_for_successor(handle: Any, before: str | None, timeout: float = 60.0) -> None:
    """Wait until the actor answers from a process other than the one at ``before``."""
    _wait_changed(lambda: lane_address(handle), before, time.monotonic() + timeout)


def _wait_changed(probe: Callable[[], object], before: object, deadline: float) -> None:
    """Wait until ``probe()`` answers something other than ``before`` (None: restarting)."""
    while probe() in (None, before):
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)


def restart(handle: Any, timeout: float = 60.0) -> None:
    """Kill the actor (Ray restarts it) and wait until its successor answers."""
    before = lane_address(handle)
    ray.kill(handle, no_restart=False)
    wait_for_successor(handle, before, timeout)


def process_id(handle: Any) -> int | None:
    """The process id of the actor behind ``handle``, or None while it restarts."""
    try:
        pid: int = ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=5)
    except ray.exceptions.RayError:
        return None
    return pid


def restart_all(handles: list[Any], timeout: float = 60.0) -> None:
    """Kill every actor of ``handles`` at once (Ray restarts each) and wait until each one's
    successor answers (from a process other than the one killed)."""
    before = [process_id(h) for h in handles]
    for handle in handles:
        ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + timeout
    for handle, old in zip(handles, before, strict=True):
        _wait_changed(functools.partial(process_id, handle), old, deadline)
