"""The journal methods transactions use (``Partition.record_transaction`` and
``next_sequence_number``): what a commit journals goes through the partition's public API.

Pure unit tests on a ``FakeClock``, no Ray.
"""

from __future__ import annotations

import pytest
import transactions_core_support
from transactions_core_support import durable, flush, prepare, props, rec

from raybus._core import journal
from raybus._core import transactions as txn
from raybus._core.partition import Partition
from raybus.testing import FakeClock

q = transactions_core_support.q


def test_next_sequence_number_is_what_the_next_stored_message_gets(q: Partition) -> None:
    assert q.next_sequence_number == 1
    [seq] = q.send([rec("a")])
    assert seq == 1 and q.next_sequence_number == 2
    assert Partition(props(), FakeClock(), partition_id=3).next_sequence_number == (3 << 48) + 1


def test_a_commit_journals_its_first_sequence_number_and_its_end(q: Partition) -> None:
    log = durable(q)
    q.send([rec("before")])
    flush(q, log)
    prepare(q, "t1", [rec("x"), rec("y")])
    first = q.next_sequence_number
    assert txn.commit(q, "t1")
    entries, _ = q.take_journal()
    ops = [(op, store, seq) for op, store, seq, _payload in entries]
    assert ops == [
        (journal.TXN_PREPARE, journal.MAIN, 0),
        (journal.TXN_COMMIT, journal.MAIN, 0),
        (journal.TXN_END, journal.MAIN, 0),
    ]
    commit_payload = entries[1][3]
    assert commit_payload[0] == "t1" and commit_payload[2] == first == 2
    assert commit_payload[3] == 2  # two sends stored, from ``first`` on
    assert entries[2][3] == "t1"


def test_record_transaction_refuses_other_entries_and_records_nothing(q: Partition) -> None:
    durable(q)
    with pytest.raises(ValueError, match="not a transaction's"):
        q.record_transaction(journal.PUT, ("anything",))
    assert q.journal_size() == 0


def test_record_transaction_without_a_journal_records_nothing(q: Partition) -> None:
    q.record_transaction(journal.TXN_END, "t1")
    assert not q.has_journal()
