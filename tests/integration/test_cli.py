"""The ``raybus`` command line against the session's Ray cluster.

Commands run in this process through typer's ``CliRunner`` (Ray is already joined, so each
takes milliseconds); one test runs the installed console script in a subprocess with
``RAY_ADDRESS`` to show the real entry point joins a cluster. The tests share one raybus
namespace per module (``--namespace``) and use their own queues.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli_runner, error_line, json_lines, own_lines

from raybus.management import ServiceBusAdministrationClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture
def admin(namespace: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient(namespace)


@pytest.fixture
def cli(namespace: str) -> Any:
    """``cli(*args, input=None, code=0)``: run ``raybus --namespace NS *args``, check the exit
    code, return the result."""
    return cli_runner(namespace)


def _name() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def test_queue_create_show_update_list_delete(cli: Any) -> None:
    q = _name()
    created = json_lines(
        cli(
            "queue",
            "create",
            q,
            "--lock-duration",
            "1m30s",
            "--ttl",
            "PT1H",
            "--max-delivery-count",
            "3",
            "--dedup",
            "--dedup-window",
            "00:01:00",
            "--partitions",
            "2",
            "--max-size",
            "100",
            "--dead-letter-expired",
            "--json",
        )
    )[0]
    assert created["name"] == q
    assert created["lock_duration"] == 90.0
    assert created["default_message_time_to_live"] == 3600.0
    assert created["max_delivery_count"] == 3
    assert created["requires_duplicate_detection"] is True
    assert created["duplicate_detection_history_time_window"] == 60.0
    assert created["partition_count"] == 2
    assert created["max_size_in_megabytes"] == 100
    assert created["dead_lettering_on_message_expiration"] is True
    assert created["auto_delete_on_idle"] is None  # never

    shown = json_lines(cli("queue", "show", q, "--json"))[0]
    assert shown["runtime"]["active_message_count"] == 0
    assert shown["runtime"]["partition_count"] == 2

    updated = json_lines(
        cli(
            "queue",
            "update",
            q,
            "--max-delivery-count",
            "5",
            "--status",
            "receivedisabled",
            "--json",
        )
    )[0]
    assert updated["max_delivery_count"] == 5 and updated["status"] == "ReceiveDisabled"
    assert updated["lock_duration"] == 90.0  # unchanged

    listed = {row["name"] for row in json_lines(cli("queue", "list", "--json"))}
    assert q in listed
    assert q in cli("queue", "list").stdout  # the table
    assert "max_delivery_count" in cli("queue", "show", q).stdout

    cli("queue", "delete", q)
    error_line(cli("queue", "show", q, code=3), "MessagingEntityNotFoundError")


def test_exit_codes_one_error_line_each(cli: Any) -> None:
    q = _name()
    cli("queue", "create", q)
    # 1: a broker error
    error_line(cli("queue", "create", q, code=1), "MessagingEntityAlreadyExistsError")
    # 2: bad values, from the command line or from the broker
    error_line(
        cli("queue", "create", _name(), "--lock-duration", "10m", code=2), "InvalidArgumentError"
    )
    assert "not a duration" in cli("queue", "create", _name(), "--ttl", "soon", code=2).stderr
    line = error_line(cli("queue", "update", q, "--sessions", code=2), "InvalidArgumentError")
    assert "requires_session" in line
    error_line(cli("queue", "create", "bad name!", code=2), "InvalidArgumentError")
    cli("receive", q, "--mode", "receiveanddelete", "--complete", code=2)
    cli("send", q, "x", "--property", "novalue", code=2)
    cli("queue", "frobnicate", code=2)
    line = error_line(
        cli("rule", "create", "t", "s", "r", "--sql", "a = = 1", code=2), "FilterSyntaxError"
    )
    assert "position 4" in line
    # 3: not found
    error_line(cli("send", _name(), "x", code=3), "MessagingEntityNotFoundError")
    error_line(cli("receive", _name(), "--wait", "0.2", code=3), "MessagingEntityNotFoundError")
    error_line(cli("dlq", "purge", _name(), code=3), "MessagingEntityNotFoundError")
    # 4: a timeout (no session arrives within --wait)
    sq = _name()
    cli("queue", "create", sq, "--sessions")
    error_line(
        cli("receive", sq, "--next-session", "--wait", "0.5", code=4), "OperationTimeoutError"
    )


def test_send_arguments_then_receive_json_lines_and_complete(
    cli: Any, admin: ServiceBusAdministrationClient
) -> None:
    q = _name()
    cli("queue", "create", q)
    sent = cli(
        "send",
        q,
        "first",
        "second",
        "third",
        "--message-id",
        "m-{n}",
        "-p",
        "n=5",
        "-p",
        "who=alice",
        "-p",
        "ok=true",
        "--ttl",
        "1h",
        "--subject",
        "greeting",
        "--correlation-id",
        "c1",
    )
    assert "sent 3 messages" in sent.stderr
    rows = json_lines(cli("receive", q, "--count", "3", "--wait", "5", "--complete"))
    assert [r["body"] for r in rows] == ["first", "second", "third"]
    assert [r["message_id"] for r in rows] == ["m-0", "m-1", "m-2"]
    for r in rows:
        assert r["application_properties"] == {"n": 5, "who": "alice", "ok": True}
        assert r["delivery_count"] == 0 and r["lock_token"]
        assert r["subject"] == "greeting" and r["correlation_id"] == "c1"
        assert r["time_to_live"] == 3600.0
        assert isinstance(r["sequence_number"], int)
        enqueued = datetime.fromisoformat(r["enqueued_time_utc"])
        expires = datetime.fromisoformat(r["expires_at_utc"])
        assert (expires - enqueued).total_seconds() == pytest.approx(3600, abs=1)
        datetime.fromisoformat(r["locked_until_utc"])
    assert len({r["sequence_number"] for r in rows}) == 3
    assert admin.get_queue_runtime_properties(q).active_message_count == 0  # completed


def test_send_reads_stdin_lines_peek_leaves_them_receive_and_delete_takes_them(
    cli: Any, admin: ServiceBusAdministrationClient
) -> None:
    q = _name()
    cli("queue", "create", q, "--partitions", "2")
    sent = cli("send", q, "--partition-key", "k", input="alpha\nbeta\n\ngamma\n")
    assert "sent 3 messages" in sent.stderr  # the empty line is skipped
    peeked = json_lines(cli("peek", q, "--count", "10"))
    assert [p["body"] for p in peeked] == ["alpha", "beta", "gamma"]
    assert all(p["lock_token"] is None and p["state"] == "active" for p in peeked)
    assert all(p["partition_key"] == "k" for p in peeked)
    assert len(json_lines(cli("peek", q, "--count", "2"))) == 2
    first = peeked[0]["sequence_number"]
    later = json_lines(cli("peek", q, "--count", "10", "--from-sequence", str(first + 1)))
    assert [p["body"] for p in later] == ["beta", "gamma"]
    taken = json_lines(cli("receive", q, "--count", "3", "--mode", "receiveanddelete"))
    assert sorted(t["body"] for t in taken) == ["alpha", "beta", "gamma"]
    assert all(t["lock_token"] is None for t in taken)
    assert admin.get_queue_runtime_properties(q).active_message_count == 0


def test_receive_abandon_redelivers_with_higher_delivery_count(cli: Any) -> None:
    q = _name()
    cli("queue", "create", q)
    cli("send", q, "again")
    [first] = json_lines(cli("receive", q, "--abandon", "--wait", "5"))
    [second] = json_lines(cli("receive", q, "--complete", "--wait", "5"))
    assert first["delivery_count"] == 0 and second["delivery_count"] == 1
    assert own_lines(cli("receive", q, "--wait", "0.2").stdout) == []  # no line, exit 0
    assert own_lines(cli("receive", q, "--wait", "0").stdout) == []


def test_session_messages_by_session_id(cli: Any) -> None:
    q = _name()
    cli("queue", "create", q, "--sessions")
    cli("send", q, "s-a", "--session-id", "a")
    cli("send", q, "s-b", "--session-id", "b")
    [row] = json_lines(cli("receive", q, "--session-id", "b", "--complete", "--wait", "5"))
    assert row["body"] == "s-b" and row["session_id"] == "b"
    [row] = json_lines(cli("receive", q, "--next-session", "--complete", "--wait", "5"))
    assert row["session_id"] == "a"


def test_dlq_list_resubmit_purge_then_purge_the_queue(
    cli: Any, admin: ServiceBusAdministrationClient
) -> None:
    q = _name()
    cli("queue", "create", q, "--max-delivery-count", "1")
    cli("send", q, "d0", "d1", "d2", "d3", "--message-id", "dl-{n}", "-p", "tag=x")
    # With max delivery count 1, an abandoned message is dead-lettered at once.
    assert len(json_lines(cli("receive", q, "--count", "4", "--abandon", "--wait", "5"))) == 4
    dead = json_lines(cli("dlq", "list", q))
    assert sorted(d["body"] for d in dead) == ["d0", "d1", "d2", "d3"]
    assert all(d["dead_letter_reason"] == "MaxDeliveryCountExceeded" for d in dead)
    assert all(d["lock_token"] is None for d in dead)

    out = cli("dlq", "resubmit", q, "--count", "3")
    assert "resubmitted 3 messages" in out.stderr
    counts = admin.get_queue_runtime_properties(q)
    assert (counts.active_message_count, counts.dead_letter_message_count) == (3, 1)
    back = json_lines(cli("peek", q, "--count", "10"))
    assert {b["message_id"] for b in back} <= {"dl-0", "dl-1", "dl-2", "dl-3"}
    assert all(b["application_properties"] == {"tag": "x"} for b in back)
    assert all(b["delivery_count"] == 0 and b["dead_letter_reason"] is None for b in back)

    assert "purged 1 dead-lettered message" in cli("dlq", "purge", q).stderr
    counts = admin.get_queue_runtime_properties(q)
    assert (counts.active_message_count, counts.dead_letter_message_count) == (3, 0)
    assert "resubmitted 0 messages" in cli("dlq", "resubmit", q, "--wait", "0.2").stderr
    # The queue's own messages: only with --yes, and only those older than --older-than.
    assert "--yes" in cli("purge", q, code=2).stderr
    assert "purged 0 messages" in cli("purge", q, "--yes", "--older-than", "1h").stderr
    assert "purged 3 messages" in cli("purge", q, "--yes").stderr
    assert admin.get_queue_runtime_properties(q).active_message_count == 0


def test_stats_once_table_and_json(cli: Any) -> None:
    q = _name()
    cli("queue", "create", q, "--partitions", "2")
    cli("send", q, "1", "2", "3", "4", "5")
    cli("send", q, "later", "--delay", "1h")
    [scheduled] = [p for p in json_lines(cli("peek", q, "--count", "10")) if p["body"] == "later"]
    assert scheduled["state"] == "scheduled" and scheduled["scheduled_enqueue_time_utc"]
    rows = json_lines(cli("stats", q, "--once", "--interval", "0.3", "--json"))
    [row] = rows
    assert row["name"] == q and row["active"] == 5 and row["partitions"] == 2
    assert row["dead_letter"] == 0 and row["scheduled"] == 1 and row["size_in_bytes"] > 0
    assert row["in_per_s"] == 0.0 and row["out_per_s"] == 0.0  # nothing moved meanwhile
    table = cli("stats", "--once", "--interval", "0.2").stdout
    assert q in table and "in/s" in table
    live = cli("stats", q, "--interval", "0.1", "--samples", "2").stdout
    assert q in live
    cli("stats", "--json", code=2)  # --json needs --once


def test_stats_rates_follow_sends_and_receives(
    cli: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import raybus
    from raybus.cli import stats as stats_command

    q = _name()
    cli("queue", "create", q)
    client = raybus.ServiceBusClient(namespace)

    # stats takes a sample, sleeps --interval, takes another; the action must fall between
    # them. A fixed head start raced the first sample on a loaded machine (CI saw both samples
    # after the send), so the samples are gated: the action starts when the first sample is
    # taken, and the second waits until the action is done.
    first_taken, action_done = threading.Event(), threading.Event()
    real_sample = stats_command.sample

    def gated_sample(*args: Any, **kwargs: Any) -> Any:
        if first_taken.is_set():
            assert action_done.wait(60), "the action between the samples did not finish"
        taken = real_sample(*args, **kwargs)
        first_taken.set()
        return taken

    monkeypatch.setattr(stats_command, "sample", gated_sample)

    def during_stats(action: Any) -> dict[str, Any]:
        first_taken.clear()
        action_done.clear()
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(cli, "stats", q, "--once", "--interval", "1.5", "--json")
            try:
                assert first_taken.wait(60), "stats took no first sample"
                action()
            finally:
                action_done.set()
            [row] = json_lines(future.result())
        return row

    with client.get_queue_sender(q) as sender:
        row = during_stats(lambda: sender.send_messages([raybus.ServiceBusMessage("x")] * 30))
    assert row["active"] == 30
    # 30 messages between two samples at least 1.5 s apart (more on a loaded machine).
    assert 0 < row["in_per_s"] <= 20.5 and row["out_per_s"] == 0

    def take() -> None:
        with client.get_queue_receiver(q, receive_mode="receiveanddelete") as r:
            while len(r.receive_messages(max_message_count=30, max_wait_time=1)) > 0:
                pass

    row = during_stats(take)
    assert row["active"] == 0
    assert row["in_per_s"] == 0 and 0 < row["out_per_s"] <= 20.5
    client.close()


def test_demo_runs(cli: Any) -> None:
    out = cli("demo").stdout
    assert "resubmitted 1 dead letter" in out and "deleted" in out


def test_console_script_joins_the_cluster_in_a_subprocess(
    ray_cluster: str, namespace: str, admin: ServiceBusAdministrationClient
) -> None:
    q = _name()
    admin.create_queue(q)
    exe = shutil.which("raybus", path=str(Path(sys.executable).parent))
    assert exe, "the raybus console script is not installed (make install)"
    env = dict(os.environ, RAY_ADDRESS=ray_cluster, RAYBUS_NAMESPACE=namespace)
    env.pop("RAYBUS_ADDRESS", None)
    proc = subprocess.run(
        [exe, "send", q, "from-a-subprocess"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert _drain(namespace, q) == ["from-a-subprocess"]


def _drain(namespace: str, queue: str) -> list[str]:
    """Receive-and-delete what ``queue`` holds, through the library (not the CLI)."""
    import raybus

    with (
        raybus.ServiceBusClient(namespace) as client,
        client.get_queue_receiver(queue, receive_mode="receiveanddelete", max_wait_time=5) as r,
    ):
        return [str(m) for m in r.receive_messages(max_message_count=10)]
