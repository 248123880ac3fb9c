"""Fault and soak tests (``make fault``): heavy, bounded in time, one local Ray per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_local import local_ray


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    with local_ray(object_store_mb=300) as address:
        yield address
