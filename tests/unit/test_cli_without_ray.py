"""The command line without Ray: parsing, rendering, rates, exit codes, help.

``ray.init`` raises during every unit test (tests/unit/conftest.py), so these also show that
``--help``, and bad rule filters or options, never join Ray (topic, subscription and rule
parsing: ``test_cli_topics_parsing.py``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
import ray
from typer.testing import CliRunner

from raybus._core.record import MessageRecord
from raybus._models import MAX_DURATION, QueueProperties, QueueRuntimeProperties
from raybus.cli import app
from raybus.cli._context import is_loopback, probe
from raybus.cli._errors import error_line, exit_code
from raybus.cli._parse import format_duration, parse_duration, parse_property
from raybus.cli._render import message_json, properties_json
from raybus.cli._sampling import QueueSample, rates
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    SessionCannotBeLockedError,
)
from raybus.message import ServiceBusReceivedMessage

runner = CliRunner()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30),
        ("1.5", 1.5),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("2h", 7200),
        ("1d12h", 129600),
        ("1w", 604800),
        ("PT1M30S", 90),
        ("pt10s", 10),
        ("P1DT2H", 93600),
        ("PT0.5S", 0.5),
        ("00:01:30", 90),
        ("1.00:00:00", 86400),
        (" 45s ", 45),
    ],
)
def test_durations_accept_seconds_compact_iso_and_timespan(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "1x", "P", "PT", "P1DT", "-5", "1m30", "m"])
def test_bad_durations_raise_value_error_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_never_only_where_allowed() -> None:
    assert parse_duration("never", allow_never=True) == MAX_DURATION
    with pytest.raises(ValueError, match="finite"):
        parse_duration("never")


def test_format_duration_round_trips_through_parse() -> None:
    for value in (timedelta(seconds=90), timedelta(days=1, hours=2), timedelta(milliseconds=250)):
        assert parse_duration(format_duration(value)) == value
    assert format_duration(MAX_DURATION) == "never"
    assert format_duration(timedelta(0)) == "0ms"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n=5", ("n", 5)),
        ("f=1.5", ("f", 1.5)),
        ("ok=true", ("ok", True)),
        ("none=null", ("none", None)),
        ('s="5"', ("s", "5")),
        ("name=alice", ("name", "alice")),
        ("list=[1,2]", ("list", "[1,2]")),
        ("eq=a=b", ("eq", "a=b")),
        ("empty=", ("empty", "")),
    ],
)
def test_properties_are_typed_like_json_scalars(text: str, expected: tuple[str, Any]) -> None:
    assert parse_property(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=5"])
def test_property_without_key_or_equals_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="key=value"):
        parse_property(text)


def _received(**fields: Any) -> ServiceBusReceivedMessage:
    rec = MessageRecord(
        sequence_number=(2 << 48) + 7,
        enqueued_time=1_700_000_000.0,
        delivery_count=1,
        lock_token="tok",
        locked_until=1_700_000_060.0,
        **fields,
    )
    return ServiceBusReceivedMessage(rec, entity="q", kind="locked")


def test_message_json_has_ids_times_counts_and_typed_properties() -> None:
    msg = _received(
        body="hello",
        message_id="m1",
        session_id="s1",
        application_properties={"n": 5, "b": b"\x00\xff"},
        time_to_live=30.0,
    )
    out = json.loads(json.dumps(message_json(msg)))
    assert out["body"] == "hello" and "body_encoding" not in out
    assert out["message_id"] == "m1" and out["session_id"] == "s1"
    assert out["sequence_number"] == (2 << 48) + 7 and out["partition_id"] == 2
    assert out["delivery_count"] == 1 and out["state"] == "active"
    assert out["lock_token"] == "tok"
    assert out["enqueued_time_utc"].startswith("2023-11-14T22:13:20")
    assert out["locked_until_utc"].startswith("2023-11-14T22:14:20")
    assert out["time_to_live"] == 30.0
    assert out["application_properties"] == {"n": 5, "b": "AP8="}


def test_message_json_bodies_utf8_text_or_base64() -> None:
    assert message_json(_received(body="é".encode()))["body"] == "é"
    binary = message_json(_received(body=b"\xff\x00"))
    assert binary["body"] == "/wA=" and binary["body_encoding"] == "base64"
    assert message_json(_received(body={"a": [1, 2]}))["body"] == {"a": [1, 2]}


def test_properties_json_durations_in_seconds_never_is_null() -> None:
    props = QueueProperties("q", lock_duration=timedelta(seconds=90))
    out = properties_json(props, QueueRuntimeProperties("q", active_message_count=3))
    assert out["lock_duration"] == 90.0
    assert out["default_message_time_to_live"] is None
    assert out["status"] == "Active"
    assert out["runtime"]["active_message_count"] == 3
    assert out["runtime"]["total_message_count"] == 3
    json.dumps(out)


def _sample(at: float, sent: float | None, active: int, dlq: int = 0) -> QueueSample:
    return QueueSample("q", at, active, dlq, 0, 1, 0, "Active", sent)


def test_rates_from_successive_samples() -> None:
    r = rates(_sample(10.0, 100, 50), _sample(12.0, 120, 40))
    assert r.incoming == pytest.approx(10.0)  # 20 sent in 2 s
    assert r.outgoing == pytest.approx(15.0)  # 20 in, held fell by 10: 30 left in 2 s


def test_rates_unknown_for_first_sample_counter_reset_or_missing_counter() -> None:
    assert rates(None, _sample(1, 5, 5)).incoming is None
    assert rates(_sample(1, 50, 5), _sample(2, 3, 5)).incoming is None  # actor restarted
    assert rates(_sample(1, None, 5), _sample(2, 3, 5)).outgoing is None
    assert rates(_sample(2, 1, 5), _sample(2, 1, 5)).incoming is None  # no time passed


def test_dead_lettering_is_not_counted_as_out() -> None:
    r = rates(_sample(0, 10, 10, 0), _sample(1, 10, 5, 5))
    assert r.incoming == 0 and r.outgoing == 0


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (MessagingEntityNotFoundError("no entity named 'q'", "q"), 3),
        (OperationTimeoutError("timed out"), 4),
        (ServiceBusConnectionError("down"), 4),
        (InvalidArgumentError("bad", "q", "lock_duration"), 2),
        (MessagingEntityAlreadyExistsError("exists", "q"), 1),
        (MessageLockLostError("lost", "q"), 1),
        (SessionCannotBeLockedError("held", "q"), 1),
    ],
)
def test_exit_code_per_error_kind(exc: Exception, code: int) -> None:
    assert exit_code(exc) == code


def test_error_line_is_one_line_with_class_name() -> None:
    line = error_line(MessagingEntityNotFoundError("no entity\nnamed 'q'", "q"))
    assert line == "error: MessagingEntityNotFoundError: no entity named 'q' (entity: q)"


COMMANDS = [
    [],
    ["queue"],
    ["queue", "create"],
    ["queue", "show"],
    ["queue", "list"],
    ["queue", "update"],
    ["queue", "delete"],
    ["send"],
    ["receive"],
    ["peek"],
    ["purge"],
    ["dlq"],
    ["dlq", "list"],
    ["dlq", "resubmit"],
    ["dlq", "purge"],
    ["stats"],
    ["demo"],
    ["topic"],
    ["topic", "create"],
    ["topic", "show"],
    ["topic", "list"],
    ["topic", "update"],
    ["topic", "delete"],
    ["subscription"],
    ["subscription", "create"],
    ["subscription", "show"],
    ["subscription", "list"],
    ["subscription", "update"],
    ["subscription", "delete"],
    ["rule"],
    ["rule", "create"],
    ["rule", "show"],
    ["rule", "list"],
    ["rule", "delete"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "raybus")
def test_every_command_has_help_without_ray(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_root_help_documents_exit_codes_and_environment() -> None:
    out = runner.invoke(app, ["--help"]).output
    for text in ("Exit codes", "not found", "OperationTimeoutError", "RAYBUS_ADDRESS"):
        assert text in out
    for text in ("RAYBUS_NAMESPACE", "RAYBUS_STORAGE_PATH", "--address", "--namespace"):
        assert text in out


@pytest.mark.parametrize(
    "args",
    [
        ["rule", "create", "t", "s", "r", "--sql", "a = = 1"],
        ["subscription", "create", "t", "s", "--sql", "a = = 1"],
        ["rule", "create", "t", "s", "r", "--true", "--action", "SET a = = 1"],
    ],
)
def test_filter_syntax_error_is_one_line_with_position_exit_2_without_ray(
    args: list[str],
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: FilterSyntaxError: SQL syntax error at position ")
    assert ">>>" in line


@pytest.mark.parametrize("group", ["topic", "subscription", "rule"])
def test_topic_groups_without_a_command_show_help(group: str) -> None:
    result = runner.invoke(app, [group])
    assert result.exit_code == 2  # as for "raybus queue": click shows the group's help
    assert "Usage:" in result.output and "create" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["purge", "q"], "--yes"),
        (["purge", "q", "--yes", "--older-than", "soon"], "not a duration"),
        (["dlq", "purge", "q", "--older-than", "soon"], "not a duration"),
    ],
    ids=["without-yes", "bad-older-than", "dlq-bad-older-than"],
)
def test_a_purge_that_would_be_wrong_is_a_usage_error_before_joining_ray(
    args: list[str], says: str
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert says in result.stderr


def test_bad_duration_option_is_a_usage_error_before_joining_ray() -> None:
    result = runner.invoke(app, ["queue", "create", "q", "--lock-duration", "soon"])
    assert result.exit_code == 2
    assert "not a duration" in result.stderr


def test_unreachable_address_raises_connection_error_quickly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As in a fresh process (in a full run the integration tests' Ray may be up already).
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with pytest.raises(ServiceBusConnectionError, match="cannot reach"):
        probe(f"127.0.0.1:{port}", timeout=2)
    result = runner.invoke(app, ["--address", f"127.0.0.1:{port}", "queue", "list"])
    assert result.exit_code == 4
    assert result.stderr.startswith("error: ServiceBusConnectionError: cannot reach")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        (None, True),
        ("auto", True),
        ("127.0.0.1:6379", True),
        ("ray://localhost:10001", True),
        ("10.0.0.5:6379", False),
        ("ray://head:10001", False),
    ],
)
def test_loopback_addresses(address: str | None, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_importing_the_cli_does_not_start_ray() -> None:
    code = "import ray, raybus.cli; assert not ray.is_initialized(); print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_authorization_rule_json_and_connection_strings_read_back_as_the_client_reads_them() -> (
    None
):
    """What ``raybus authorization-rule create|show`` prints: the rule's rights in order, and a
    connection string per key that ``parse_connection_string`` and the client's namespace rule
    read back as this namespace, this rule and this key (with ``EntityPath`` for an entity's)."""
    from raybus.auth import (
        AccessRights,
        AuthorizationRule,
        SharedAccessKeyCredential,
        parse_connection_string,
    )
    from raybus.cli.authorization_rule import rule_json

    rule = AuthorizationRule(
        "app", frozenset({AccessRights.LISTEN, AccessRights.SEND}), "P" * 44, "S" * 44, "Orders"
    )
    assert rule_json(rule) == {"key_name": "app", "rights": ["Send", "Listen"], "entity": "Orders"}
    shown = rule_json(rule, "shop-1")
    for which, key in (("primary", "P" * 44), ("secondary", "S" * 44)):
        parsed = parse_connection_string(shown[f"{which}_connection_string"])
        assert isinstance(parsed.credential, SharedAccessKeyCredential)
        assert parsed.namespace == "shop-1" and parsed.entity_path == "Orders"
        assert (parsed.credential.key_name, parsed.credential._key) == ("app", key)
    namespace_wide = rule_json(AuthorizationRule("root", frozenset({AccessRights.MANAGE})), "shop")
    assert "EntityPath" not in namespace_wide["primary_connection_string"]
    assert namespace_wide["entity"] is None


def test_authorization_rule_create_without_rights_is_a_usage_error_before_ray() -> None:
    result = CliRunner().invoke(app, ["authorization-rule", "create", "x", "--rights", " , "])
    assert result.exit_code == 2
    assert "rights" in result.stderr
