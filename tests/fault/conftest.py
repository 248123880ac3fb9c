"""Fault and soak tests (``make fault``): heavy, bounded in time, one local Ray per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=300 * 1024 * 1024,
        logging_level="WARNING",
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
