"""open_storage and local-path detection."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from storage_helpers import batch, faulty_fs, recovered_values, reopen

from raybus._storage import DurableLog, open_storage
from raybus._storage.fs import join, local_path
from raybus.exceptions import InvalidArgumentError


def test_plain_path_is_local_and_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fs, directory = open_storage("data", "ns", "orders/0")
    assert isinstance(fs, pafs.LocalFileSystem)
    assert directory == str(tmp_path / "data" / "ns" / "orders" / "0")


def test_file_uri_opens_the_local_filesystem(tmp_path: Path) -> None:
    fs, directory = open_storage(tmp_path.as_uri(), "q")
    assert local_path(fs, directory) == str(tmp_path / "q")


def test_mock_uri_opens_a_non_local_filesystem() -> None:
    fs, directory = open_storage("mock:///bucket", "q")
    assert local_path(fs, directory) is None
    assert directory.endswith("bucket/q")


@pytest.mark.parametrize("bad", [("",), ("a//b",), ("..",), ("a/./b",)])
def test_bad_subdirectories_are_refused(bad: tuple[str, ...]) -> None:
    with pytest.raises(InvalidArgumentError):
        open_storage("/tmp/x", *bad)


@pytest.mark.parametrize("uri", ["", "nosuchscheme://x/y"])
def test_bad_storage_paths_are_refused(uri: str) -> None:
    with pytest.raises(InvalidArgumentError):
        open_storage(uri)


def test_local_path_sees_through_nested_subtrees(tmp_path: Path) -> None:
    inner = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    outer = pafs.SubTreeFileSystem("a", inner)
    assert local_path(outer, "b/c.arrow") == str(tmp_path / "a" / "b" / "c.arrow")
    assert local_path(faulty_fs()[0], "b") is None


def test_join_skips_empty_parts_and_doubled_slashes() -> None:
    assert join("", "log", "x") == "log/x"
    assert join("/base/", "/log") == "/base/log"
    assert join("/", "log") == "/log"


def test_subtree_log_writes_through_the_real_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    log = DurableLog(fs, "ns/q")
    log.recover()
    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(os, "fdatasync", spy, raising=False)  # the segment's own sync
    log.append(batch([1]))
    assert len(synced) == 2  # the new segment and its directory
    assert (tmp_path / "ns" / "q" / "log" / f"{1:020d}.seg").is_file()
    log.append(batch([2]))
    assert len(synced) == 3  # appending to the segment: the segment only
    monkeypatch.undo()
    assert recovered_values(reopen(log)[1]) == [1, 2]


def test_from_storage_path_on_a_uri(tmp_path: Path) -> None:
    log = DurableLog.from_storage_path(tmp_path.as_uri(), "q")
    log.recover()
    log.append(batch([5]))
    assert recovered_values(reopen(log)[1]) == [5]
    assert (tmp_path / "q" / "log").is_dir()
