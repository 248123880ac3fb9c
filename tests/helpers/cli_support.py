"""Reading what a ``raybus`` command printed through typer's ``CliRunner``.

The runner swaps ``sys.stdout`` for the whole process while a command runs, so a line the Ray
driver prints from its own thread meanwhile (a raylet warning such as "N PYTHON worker
processes have been started", tagged ``(raylet)``) lands in the command's output. Those lines
are Ray's, not the command's: the helpers drop them before reading the command's own lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from typer.testing import CliRunner, Result

from raybus.cli import app

_RAY_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\((raylet|pid=\d+|\w+ pid=\d+)[^)]*\)")


def own_lines(text: str) -> list[str]:
    """The non-blank lines of ``text`` that the command printed (Ray's own lines dropped)."""
    return [line for line in text.splitlines() if line.strip() and not _RAY_LINE.match(line)]


def json_lines(result: Result) -> list[dict[str, Any]]:
    """The command's ``--json`` output: one object per line."""
    return [json.loads(line) for line in own_lines(result.stdout)]


def error_line(result: Result, cls: str) -> str:
    """The command's one error line, checked to name the error class ``cls``."""
    [line] = own_lines(result.stderr)
    assert line.startswith(f"error: {cls}: "), line
    return line


def cli_runner(namespace: str, env: dict[str, str] | None = None) -> Callable[..., Result]:
    """``run(*args, input=None, code=0, env=None)``: run ``raybus --namespace NS *args`` in this
    process, re-raise an error the command did not turn into an exit code, check the exit code,
    return the result. ``env`` (the runner's, then the call's) is set while the command runs."""
    runner = CliRunner(env=env)

    def run(
        *args: str, input: str | None = None, code: int = 0, env: dict[str, str] | None = None
    ) -> Result:
        result = runner.invoke(app, ["--namespace", namespace, *args], input=input, env=env)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    return run
