"""Every script in examples/ runs to completion (examples are documentation that runs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT_S = 300  # all of them at once, on a loaded 2-core machine


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/ has no scripts"


Run = tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]  # the process, stdout, stderr


@pytest.fixture(scope="module")
def runs(ray_cluster: str) -> Iterator[dict[str, Run]]:
    """Every example started at once (each in its own namespace): they wait on Ray far more
    than they compute, so side by side they take about as long as the slowest, not the sum
    of all (about 70 s one after another here). Output goes to a file, not a pipe, so that
    no script blocks on a full pipe that nobody reads yet."""
    env = dict(os.environ)
    env["RAY_ADDRESS"] = ray_cluster  # join the session's cluster instead of starting one
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started: dict[str, Run] = {}
    with contextlib.ExitStack() as files:
        try:
            for script in EXAMPLES:
                out = files.enter_context(tempfile.TemporaryFile())
                err = files.enter_context(tempfile.TemporaryFile())
                proc = subprocess.Popen(
                    [sys.executable, str(script)], env=env, stdout=out, stderr=err, cwd=ROOT
                )
                started[script.name] = (proc, out, err)
            yield started
        finally:
            for proc, _out, _err in started.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _text(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path, runs: dict[str, Run]) -> None:
    proc, out, err = runs[script.name]
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout, stderr = _text(out), _text(err)
    assert proc.returncode == 0, f"{script.name} failed ({proc.returncode}):\n{stdout}\n{stderr}"
    assert stdout.strip(), f"{script.name} printed nothing"
