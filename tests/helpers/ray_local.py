"""One local Ray cluster on 127.0.0.1 for a test session (shared by the Ray test suites)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ray


@contextmanager
def local_ray(object_store_mb: int = 200) -> Iterator[str]:
    """Start a local two-CPU Ray (no dashboard); yield its GCS address; always shut it down."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=object_store_mb * 1024 * 1024,
        logging_level="WARNING",
        log_to_driver=False,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
