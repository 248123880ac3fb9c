"""Storage errors cross actor boundaries: they pickle with every field intact."""

from __future__ import annotations

import errno
import pickle

import pytest

from raybus._storage import StorageCorruptedError, StorageUnavailableError
from raybus.exceptions import ServiceBusError


@pytest.mark.parametrize(
    "error",
    [
        StorageUnavailableError("writing x failed", "/d/log/x.arrow", errno.ENOSPC),
        StorageUnavailableError("listing failed", "s3://b/q", None, "orders"),
        StorageUnavailableError("bare"),
        StorageCorruptedError("/d/log/2.arrow", "CRC-32 mismatch"),
        StorageCorruptedError("/d/log/2.arrow", "missing", "orders"),
    ],
)
def test_errors_pickle_round_trip(error: ServiceBusError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)
    assert str(copy) == str(error)
    assert copy.retryable is error.retryable


def test_fields_and_retryability() -> None:
    unavailable = StorageUnavailableError("disk full", "/d/x", errno.ENOSPC, "orders")
    assert (unavailable.path, unavailable.errno, unavailable.entity) == (
        "/d/x",
        errno.ENOSPC,
        "orders",
    )
    assert unavailable.retryable is True
    assert str(unavailable) == "disk full (entity: orders)"

    corrupted = StorageCorruptedError("/d/x", "bad CRC")
    assert (corrupted.path, corrupted.reason) == ("/d/x", "bad CRC")
    assert corrupted.retryable is False
    assert "bad CRC" in str(corrupted) and "/d/x" in str(corrupted)
    assert isinstance(corrupted, ServiceBusError)
