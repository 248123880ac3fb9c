"""One local Ray cluster on 127.0.0.1 for a test session (shared by the Ray test suites)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

# Ray's log monitor (its own process) globs the log folder every 0.1 s while it holds fewer
# than 1,000 files, to stream worker output to the driver. The tests start hundreds of
# workers and do not stream their logs (``log_to_driver=False``): measured, the monitor took
# 5 % of the suite's CPU. These make it look for new files every 5 s instead.
TEST_LOG_MONITOR_ENV = {
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "5",
}


@contextmanager
def local_ray(object_store_mb: int = 200) -> Iterator[str]:
    """Start a local two-CPU Ray (no dashboard); yield its GCS address; always shut it down."""
    if ray.is_initialized():
        ray.shutdown()
    for key, value in TEST_LOG_MONITOR_ENV.items():
        os.environ.setdefault(key, value)  # read by the monitor process ray.init starts
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
