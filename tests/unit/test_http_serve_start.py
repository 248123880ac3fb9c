"""Starting Serve for the HTTP gateway when its first proxy is too slow, without Ray: a fake
``serve`` module stands in for Ray Serve, a loopback listener for the restarted proxy."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
import ray.exceptions

from raybus.http import _start_serve, _wait_listening


class FakeServe:
    """``serve.start`` as Ray Serve's behaves when its controller killed the first proxy
    (``died`` times raising ``ActorDiedError``), recording each call's options."""

    def __init__(self, died: int) -> None:
        self.died = died
        self.calls: list[dict[str, Any]] = []

    def start(self, **options: Any) -> None:
        self.calls.append(options)
        if self.died:
            self.died -= 1
            raise ray.exceptions.ActorDiedError()


OPTIONS = {"host": "127.0.0.1", "port": 1}
LOGGING = {"enable_access_log": False}


def test_a_proxy_ready_in_time_starts_serve_once() -> None:
    serve = FakeServe(died=0)
    assert _start_serve(serve, OPTIONS, LOGGING) is False
    assert serve.calls == [{"http_options": OPTIONS, "logging_config": LOGGING}]


def test_a_killed_first_proxy_connects_again_with_the_same_options() -> None:
    serve = FakeServe(died=1)
    assert _start_serve(serve, OPTIONS, LOGGING) is True
    assert serve.calls == [{"http_options": OPTIONS, "logging_config": LOGGING}] * 2


def test_a_second_failure_is_raised() -> None:
    serve = FakeServe(died=2)
    with pytest.raises(ray.exceptions.ActorDiedError):
        _start_serve(serve, OPTIONS, LOGGING)
    assert len(serve.calls) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_waiting_for_the_port_returns_once_something_listens() -> None:
    port = _free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    t = threading.Thread(target=listen_later)
    start = time.monotonic()
    t.start()
    try:
        _wait_listening("127.0.0.1", port, timeout_s=10.0)
        assert 0.4 <= time.monotonic() - start < 10.0
    finally:
        t.join()
        listener.close()


def test_waiting_for_a_port_nobody_opens_names_it() -> None:
    port = _free_port()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
        _wait_listening("127.0.0.1", port, timeout_s=0.5)
