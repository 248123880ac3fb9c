"""Every settings option of ``raybus queue|topic|subscription create|update``, without Ray.

Each option is given on the real command line; a stand-in admin client records the keyword
options the command passes, which must be the model field with the parsed value (and a field
the model accepts). An option an entity does not take, or a bad duration, is a usage error
(exit code 2) and nothing reaches the admin client.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from raybus._models import MAX_DURATION, QueueProperties
from raybus._topic_models import SubscriptionProperties, TopicProperties
from raybus.cli import _context, app
from raybus.cli._options import model_options

runner = CliRunner()

# flag -> (command-line words, model field, the value the model must receive)
OPTIONS: dict[str, tuple[list[str], str, Any]] = {
    "lock-duration": (["--lock-duration", "30s"], "lock_duration", timedelta(seconds=30)),
    "max-delivery-count": (["--max-delivery-count", "3"], "max_delivery_count", 3),
    "ttl": (["--ttl", "never"], "default_message_time_to_live", MAX_DURATION),
    "dead-letter-expired": (
        ["--dead-letter-expired"],
        "dead_lettering_on_message_expiration",
        True,
    ),
    "dead-letter-filter-errors": (
        ["--no-dead-letter-filter-errors"],
        "dead_lettering_on_filter_evaluation_exceptions",
        False,
    ),
    "dedup": (["--dedup"], "requires_duplicate_detection", True),
    "dedup-window": (
        ["--dedup-window", "PT2M"],
        "duplicate_detection_history_time_window",
        timedelta(minutes=2),
    ),
    "sessions": (["--sessions"], "requires_session", True),
    "partitions": (["--partitions", "4"], "partition_count", 4),
    "min-partitions": (["--min-partitions", "2"], "min_partitions", 2),
    "max-partitions": (["--max-partitions", "8"], "max_partitions", 8),
    "target-backlog": (["--target-backlog", "500"], "target_backlog_per_partition", 500),
    "max-size": (["--max-size", "2048"], "max_size_in_megabytes", 2048),
    "max-message-size": (["--max-message-size", "1024"], "max_message_size_in_kilobytes", 1024),
    "status": (["--status", "senddisabled"], "status", "SendDisabled"),
    "auto-delete-on-idle": (
        ["--auto-delete-on-idle", "1h"],
        "auto_delete_on_idle",
        timedelta(hours=1),
    ),
    "express": (["--express"], "enable_express", True),
    "ordering": (["--no-ordering"], "support_ordering", False),
    "batched": (["--no-batched"], "enable_batched_operations", False),
    "forward-to": (["--forward-to", "dest"], "forward_to", "dest"),
    "forward-dead-lettered-to": (
        ["--forward-dead-lettered-to", "dlq"],
        "forward_dead_lettered_messages_to",
        "dlq",
    ),
    "user-metadata": (["--user-metadata", "hello there"], "user_metadata", "hello there"),
}
QUEUE_ONLY = ["min-partitions", "max-partitions", "target-backlog", "express"]
BY_ENTITY = {
    "queue": [
        *("lock-duration", "max-delivery-count", "ttl", "dead-letter-expired", "dedup"),
        *("dedup-window", "sessions", "partitions", *QUEUE_ONLY, "max-size"),
        *("max-message-size", "status", "auto-delete-on-idle", "batched", "forward-to"),
        *("forward-dead-lettered-to", "user-metadata"),
    ],
    "topic": [
        *("ttl", "dedup", "dedup-window", "max-size", "max-message-size", "status"),
        *("auto-delete-on-idle", "ordering", "batched", "user-metadata"),
    ],
    "subscription": [
        *("lock-duration", "max-delivery-count", "ttl", "dead-letter-expired"),
        *("dead-letter-filter-errors", "sessions", "partitions", "status"),
        *("auto-delete-on-idle", "batched", "forward-to", "forward-dead-lettered-to"),
        "user-metadata",
    ],
}
MODEL = {"queue": QueueProperties, "topic": TopicProperties, "subscription": SubscriptionProperties}
NAMES = {"queue": ["q"], "topic": ["t"], "subscription": ["t", "s"]}


class RecordingAdmin:
    """Stands in for ``ServiceBusAdministrationClient``: ``create_*``/``update_*`` record the
    keyword options they got and return properties; ``get_*`` returns default properties."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        verb, _, kind = method.partition("_")
        model = MODEL.get(kind)
        if method == "wait_for_partitions":
            return lambda path: self.calls.append(("wait", {"path": path}))
        if model is None or verb not in ("create", "get", "update"):
            raise AttributeError(method)

        def call(*args: Any, default_rule: Any = None, **options: Any) -> Any:
            if verb != "get":
                self.calls.append((verb, options))
            return args[-1] if verb == "update" else model(*args)

        return call


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> RecordingAdmin:
    fake = RecordingAdmin()
    monkeypatch.setattr(_context.CliContext, "admin", lambda self: fake)
    return fake


@pytest.mark.parametrize(("entity", "flag"), [(e, f) for e, fs in BY_ENTITY.items() for f in fs])
def test_each_setting_reaches_the_admin_call_as_its_model_field(
    admin: RecordingAdmin, entity: str, flag: str
) -> None:
    words, field, value = OPTIONS[flag]
    result = runner.invoke(app, [entity, "create", *NAMES[entity], *words, "--json"])
    assert result.exit_code == 0, result.output
    assert admin.calls == [("create", {field: value})]
    assert field in MODEL[entity].option_names()


@pytest.mark.parametrize("entity", BY_ENTITY)
def test_create_and_update_take_all_settings_at_once_and_update_only_those_given(
    admin: RecordingAdmin, entity: str
) -> None:
    words = [w for flag in BY_ENTITY[entity] for w in OPTIONS[flag][0]]
    expected = {OPTIONS[f][1]: OPTIONS[f][2] for f in BY_ENTITY[entity]}
    for command in ("create", "update"):
        assert runner.invoke(app, [entity, command, *NAMES[entity], *words]).exit_code == 0
    assert admin.calls == [("create", expected), ("update", expected)]
    admin.calls.clear()
    assert runner.invoke(app, [entity, "update", *NAMES[entity]]).exit_code == 0
    assert admin.calls == [("update", {})]  # update changes only what was given


@pytest.mark.parametrize(
    ("entity", "flag"),
    [(e, f) for e in BY_ENTITY for f in OPTIONS if f not in BY_ENTITY[e]],
)
def test_a_setting_the_entity_does_not_have_is_a_usage_error(
    admin: RecordingAdmin, entity: str, flag: str
) -> None:
    result = runner.invoke(app, [entity, "create", *NAMES[entity], *OPTIONS[flag][0]])
    assert result.exit_code == 2
    assert "No such option" in result.output
    assert admin.calls == []


@pytest.mark.parametrize(
    ("entity", "words", "message"),
    [
        ("queue", ["--lock-duration", "never"], "finite"),
        ("subscription", ["--lock-duration", "soon"], "not a duration"),
        ("queue", ["--dedup-window", "soon"], "not a duration"),
        ("topic", ["--ttl", "soon"], "not a duration"),
        ("subscription", ["--auto-delete-on-idle", "1 hour"], "not a duration"),
    ],
)
def test_a_bad_duration_names_its_option_and_changes_nothing(
    admin: RecordingAdmin, entity: str, words: list[str], message: str
) -> None:
    for command in ("create", "update"):
        result = runner.invoke(app, [entity, command, *NAMES[entity], *words])
        assert result.exit_code == 2
        assert message in result.output and words[0] in result.output
    assert admin.calls == []


@pytest.mark.parametrize(("entity", "path"), [("queue", "q"), ("subscription", "t/s")])
def test_update_waits_for_a_partition_change_only_when_asked(
    admin: RecordingAdmin, entity: str, path: str
) -> None:
    args = [entity, "update", *NAMES[entity], "--partitions", "2"]
    assert runner.invoke(app, args).exit_code == 0
    assert [c for c, _o in admin.calls] == ["update"]
    admin.calls.clear()
    assert runner.invoke(app, [*args, "--wait"]).exit_code == 0
    assert [c for c, _o in admin.calls] == ["update", "wait"]


def test_model_options_refuses_a_setting_the_entity_does_not_have() -> None:
    with pytest.raises(TypeError, match="express"):
        model_options("topic", express=True)
    with pytest.raises(ValueError, match="rule"):
        model_options("rule")
