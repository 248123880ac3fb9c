"""An actor's call to itself from ``__init__``, made again until it is answered.

A restarted actor resumes its unfinished work without waiting for a client (a router its
undelivered publishes and its scheduled messages, the coordinator its logged decisions, the
namespace its partition changes, a partition its transactions and forwarding): ``__init__``
calls one of the actor's own methods, which runs once construction has ended. Nobody waited
for that call, so a call lost while Ray restarts the actor would go unnoticed: under load a
router came back and answered, and its logged publish was not delivered, which only that call
starts (CI, ``test_a_router_restarted_with_a_publish_undelivered_finishes_it_unasked``; the
loss is the likeliest cause, not a proven one). Here a daemon thread makes the call and waits
for its answer, and calls again after a failure or a ``timeout_s`` without one, until one call
is answered (the pause between calls doubles, up to a minute: a partition whose storage stays
broken refuses every call). The method must be idempotent (each is: it starts its work only
when that is not already running).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

__all__ = ["call_self_until_answered"]

_log = logging.getLogger("raybus.actors")


def call_self_until_answered(
    call: Callable[[], Any],
    what: str,
    *,
    timeout_s: float = 30.0,
    pause_s: float = 1.0,
    get: Callable[..., Any] = ray.get,
) -> threading.Thread:
    """Start the thread that makes ``call()`` (an ``ObjectRef``) until ``get`` answers it;
    ``what`` names the call in the log. Returns the thread (tests join it)."""

    def run() -> None:
        pause = pause_s
        while True:
            try:
                get(call(), timeout=timeout_s)
                return
            except Exception as exc:  # lost, failed or unanswered: make it again
                _log.info("%s not answered yet, calling again in %.0f s: %r", what, pause, exc)
                time.sleep(pause)
                pause = min(2 * pause, 60.0)

    thread = threading.Thread(target=run, name=f"raybus-{what}", daemon=True)
    thread.start()
    return thread
