"""The namespace registry: names are case-insensitive, incarnations never repeat."""

from __future__ import annotations

import dataclasses

import pytest

from raybus._core.registry import Registry
from raybus._models import QueueProperties
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
)
from raybus.testing import FakeClock


@pytest.fixture
def registry() -> Registry:
    return Registry("ns", FakeClock())


def test_create_then_get_is_case_insensitive(registry: Registry) -> None:
    registry.create(QueueProperties("Orders"))
    assert registry.get("orders").properties.name == "Orders"


def test_create_twice_with_other_case_raises_already_exists(registry: Registry) -> None:
    registry.create(QueueProperties("orders"))
    with pytest.raises(MessagingEntityAlreadyExistsError):
        registry.create(QueueProperties("ORDERS"))


def test_recreated_entity_gets_new_incarnation_and_partition_names(registry: Registry) -> None:
    first = registry.create(QueueProperties("q"))
    registry.delete("q")
    second = registry.create(QueueProperties("q"))
    assert second.incarnation != first.incarnation
    assert not set(first.partition_names("ns").values()) & set(
        second.partition_names("ns").values()
    )


@pytest.mark.parametrize(
    "option",
    [
        {"forward_to": "other"},
        {"forward_dead_lettered_messages_to": "other"},
    ],
)
def test_forwarding_settings_are_registered(registry: Registry, option: dict) -> None:
    """The registry stores them; the namespace actor checks the destination exists."""
    registry.create(QueueProperties("other"))
    entry = registry.create(QueueProperties("q", **option))
    assert getattr(entry.properties, next(iter(option))) == "other"


def test_update_changes_settings_and_time_but_not_created_name() -> None:
    clock = FakeClock()
    registry = Registry("ns", clock)
    registry.create(QueueProperties("Orders"))
    clock.advance(5)
    entry = registry.update(QueueProperties("orders", max_delivery_count=3))
    assert entry.properties.max_delivery_count == 3
    assert entry.properties.name == "Orders"
    assert entry.updated_at == entry.created_at + 5
    assert registry.now() == entry.updated_at  # what the namespace stamps rules with


def test_update_of_field_fixed_at_creation_raises_and_changes_nothing(registry: Registry) -> None:
    registry.create(QueueProperties("q"))
    with pytest.raises(InvalidArgumentError) as err:
        registry.update(QueueProperties("q", requires_duplicate_detection=True))
    assert err.value.argument == "requires_duplicate_detection"
    assert registry.get("q").properties.requires_duplicate_detection is False


def test_unknown_entity_raises_not_found(registry: Registry) -> None:
    for op in (registry.get, registry.delete):
        with pytest.raises(MessagingEntityNotFoundError):
            op("missing")
    with pytest.raises(MessagingEntityNotFoundError):
        registry.update(QueueProperties("missing"))


def test_list_is_sorted_by_name(registry: Registry) -> None:
    for name in ("b", "A", "c"):
        registry.create(QueueProperties(name))
    assert [e.properties.name for e in registry.list()] == ["A", "b", "c"]


def test_entries_are_snapshots(registry: Registry) -> None:
    entry = registry.create(QueueProperties("q"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.incarnation = 99  # type: ignore[misc]


def test_a_namespace_is_born_once_and_its_birth_is_in_the_snapshot() -> None:
    clock = FakeClock()
    registry = Registry("ns", clock)
    assert registry.created_at is None
    born = registry.born()
    assert born == clock.now() and registry.created_at == born
    clock.advance(60)
    assert registry.born() is None  # already born: nothing new to log
    assert registry.created_at == born
    assert ("born", born) in registry.snapshot()


def test_a_restored_namespace_keeps_its_birth_and_a_log_without_one_gets_one() -> None:
    clock = FakeClock()
    first = Registry("ns", clock)
    first.born()
    first.create(QueueProperties("orders"))
    clock.advance(3600)
    restored = Registry("ns", clock)
    restored.restore(first.snapshot())
    assert restored.born() is None
    assert restored.created_at == first.created_at
    # A log written before creation times were kept has no "born": born now, to be logged.
    old_log = [change for change in first.snapshot() if change[0] != "born"]
    upgraded = Registry("ns", clock)
    upgraded.restore(old_log)
    assert upgraded.born() == clock.now()
    assert [q.properties.name for q in upgraded.list()] == ["orders"]
