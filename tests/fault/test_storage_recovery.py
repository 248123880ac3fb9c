"""A partition restarted while its storage is unreadable or damaged (``make fault``).

The documented behaviour (README, Durability; ``raybus._storage.log``): a torn end of the log
is dropped (covered by the ``torn-log-tail`` run in ``test_reliability.py``); damage before
valid records is reported as ``StorageCorruptedError`` and never skipped; a partition whose log
cannot be read is restarted by Ray until the storage answers.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from segment_files import flip_in_record, record_starts, segments

import raybus
from raybus import ServiceBusMessage
from raybus._core.registry import partition_storage_dirs
from raybus._storage import StorageCorruptedError
from raybus.exceptions import MessagingEntityNotFoundError, ServiceBusError
from raybus.management import ServiceBusAdministrationClient

pytestmark = [pytest.mark.fault, pytest.mark.timeout(120)]

SENT = [f"m{i}" for i in range(15)]


@dataclass
class Stored:
    client: raybus.ServiceBusClient
    admin: ServiceBusAdministrationClient
    log_dir: Path
    partition: Any


@pytest.fixture
def stored(ray_cluster: str, tmp_path: Path) -> Iterator[Stored]:
    """A one-partition queue holding 15 messages written as five records of one segment."""
    ns = f"rec-{uuid.uuid4().hex[:6]}"
    storage = str(tmp_path / "storage")
    admin = ServiceBusAdministrationClient(ns, storage_path=storage)
    client = raybus.connect(ns, storage_path=storage)
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        for i in range(0, 15, 3):
            sender.send_messages([ServiceBusMessage(m, message_id=m) for m in SENT[i : i + 3]])
    route = ray.get(client._aio._conn.registry.route.remote("q"))
    log_dir = Path(storage, *partition_storage_dirs(ns, "q", route.incarnation, 0), "log")
    assert len(record_starts(segments(log_dir)[-1].read_bytes())) >= 3
    yield Stored(client, admin, log_dir, route.existing()[0][1])
    try:
        admin.delete_queue("q")
    except ServiceBusError:
        pass


def _receive_all(client: raybus.ServiceBusClient) -> list[str]:
    with client.get_queue_receiver("q", max_wait_time=3) as r:
        got = r.receive_messages(50, max_wait_time=3)
        r.complete_messages(got)
    return sorted(str(m) for m in got)


def _kill_and_wait(partition: Any) -> None:
    ray.kill(partition, no_restart=False)
    time.sleep(3)  # the kill lands and the restart's recovery runs


def _make_unreadable(log_dir: Path) -> Path:
    """Put the log aside and a file in its place: every read of the log fails. Returns where
    the log went."""
    aside = log_dir.with_name("log.away")
    log_dir.rename(aside)
    log_dir.write_text("not a directory")
    return aside


def test_partition_restarted_while_its_storage_is_unreadable_comes_back_when_it_answers(
    stored: Stored,
) -> None:
    aside = _make_unreadable(stored.log_dir)
    try:
        _kill_and_wait(stored.partition)
        with pytest.raises(ServiceBusError) as err:
            _receive_all(stored.client)
        assert err.value.retryable, f"{err.value!r}: the queue is there, only its disk is not"
    finally:
        stored.log_dir.unlink()
        aside.rename(stored.log_dir)
    deadline = time.monotonic() + 30
    while True:
        try:
            assert _receive_all(stored.client) == sorted(SENT)
            break
        except ServiceBusError:
            assert time.monotonic() < deadline, "never came back once the storage answered"
            time.sleep(0.5)


@pytest.mark.parametrize("damage", ["unreadable", "damaged"])
def test_a_queue_whose_log_cannot_be_read_can_still_be_deleted(stored: Stored, damage: str) -> None:
    """Deleting a queue whose restarted partition cannot read its log works: an unreadable log
    (the actor exits and Ray restarts it, over and over) or a damaged one (the actor stays up
    without a committer, answering ``StorageCorruptedError``). The storage goes, the queue's
    users are told it is gone, and a new queue of the same name starts empty."""
    if damage == "unreadable":
        _make_unreadable(stored.log_dir)
    else:
        _garble_second_record(stored.log_dir)
    _kill_and_wait(stored.partition)
    with pytest.raises(ServiceBusError) as err:
        _receive_all(stored.client)
    assert isinstance(err.value, StorageCorruptedError) == (damage == "damaged"), repr(err.value)
    entity_dir = stored.log_dir.parents[1]  # the queue incarnation: every partition's files
    assert entity_dir.is_dir()

    stored.admin.delete_queue("q")
    assert not entity_dir.exists(), "the deleted queue's storage is still there"
    with (
        pytest.raises(MessagingEntityNotFoundError),
        stored.client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("after the delete"))
    stored.admin.create_queue("q")
    with stored.client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("new", message_id="new"))
    assert _receive_all(stored.client) == ["new"]


def _garble_second_record(log_dir: Path) -> tuple[Path, bytes, dict[str, bytes]]:
    files = sorted(log_dir.iterdir())
    before = {f.name: f.read_bytes() for f in files}
    victim = segments(log_dir)[-1]
    # One flipped payload byte of the second record: the CRC no longer matches, and intact
    # records follow it.
    return victim, flip_in_record(victim, 1), before


def test_damaged_log_record_before_the_tail_is_refused_not_skipped(stored: Stored) -> None:
    """Nothing is served from a partition whose log is damaged in the middle (serving the
    records around the damage would silently lose the damaged one's messages), and recovery
    changes no file."""
    victim, garbled, before = _garble_second_record(stored.log_dir)
    _kill_and_wait(stored.partition)
    with pytest.raises(ServiceBusError):
        _receive_all(stored.client)
    after = {f.name: f.read_bytes() for f in sorted(stored.log_dir.iterdir())}
    assert after == {**before, victim.name: garbled}


def test_damaged_log_file_is_reported_as_corruption_and_recovers_once_restored(
    stored: Stored,
) -> None:
    """A restarted partition whose log is damaged stays up, answers StorageCorruptedError (not
    "entity deleted"), changes no file, and reads the log again once it has been restored."""
    victim, _garbled, before = _garble_second_record(stored.log_dir)
    _kill_and_wait(stored.partition)
    with pytest.raises(StorageCorruptedError):
        _receive_all(stored.client)
    victim.write_bytes(before[victim.name])  # the operator restores it from a backup
    deadline = time.monotonic() + 30
    while True:
        try:
            assert _receive_all(stored.client) == sorted(SENT)
            return
        except StorageCorruptedError:
            assert time.monotonic() < deadline
            time.sleep(0.5)


def test_log_file_names_are_what_the_fixture_expects(stored: Stored) -> None:
    """Guards the tests above: they edit files the partition really reads."""
    names = sorted(p.name for p in stored.log_dir.iterdir())
    assert names == [f"{1:020d}.seg"] and os.path.isdir(stored.log_dir)
