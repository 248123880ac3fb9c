"""Killing a broker actor and knowing when its successor answers.

``ray.kill`` returns before the old process has died, and until it has, the old actor still
answers: a test that acts at once may be answered by the process about to die (a receive it
answered, then a complete that reached the successor, is refused). A partition actor's lane
address names its process, so a new address means the successor is up.
"""

from __future__ import annotations

import time
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
    deadline = time.monotonic() + timeout
    while lane_address(handle) in (None, before):
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)


def restart(handle: Any, timeout: float = 60.0) -> None:
    """Kill the actor (Ray restarts it) and wait until its successor answers."""
    before = lane_address(handle)
    ray.kill(handle, no_restart=False)
    wait_for_successor(handle, before, timeout)
