"""Fixtures for the storage tests: one ``DurableLog`` factory per kind of filesystem.

``make_log`` writes one file per append on every filesystem (on the local disk by
``segment_bytes=None``), so these tests pin that layout, which object stores use and which
logs written before segments have; ``test_storage_segments.py`` covers the segment layout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from storage_helpers import faulty_fs

from raybus._storage import DurableLog

BACKENDS = ["local", "subtree", "mock", "pyfs"]


def _filesystem(kind: str, tmp_path: Path) -> tuple[pafs.FileSystem, str]:
    if kind == "local":
        return pafs.LocalFileSystem(), str(tmp_path / "store")
    if kind == "subtree":
        return pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()), "ns/q/0"
    if kind == "mock":
        return pafs._MockFileSystem(), "ns/q/0"
    fs, _ = faulty_fs()
    return fs, "bucket/ns/q/0"


@pytest.fixture(params=BACKENDS)
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], DurableLog]:
    """``make_log()``: a recovered ``DurableLog``, on the same files each call."""
    fs, directory = _filesystem(request.param, tmp_path)

    def make() -> DurableLog:
        log = DurableLog(fs, directory, segment_bytes=None)
        log.recover()
        return log

    return make
