"""``raybus gateway`` without Ray: it is listed, documents its options, and refuses a bad
``--duration`` before joining Ray (``ray.init`` raises in every unit test)."""

from __future__ import annotations

from typer.testing import CliRunner

from raybus.cli import app

runner = CliRunner()


def test_the_gateway_command_is_listed_with_its_options() -> None:
    listed = runner.invoke(app, ["--help"])
    assert listed.exit_code == 0 and "gateway" in listed.output
    shown = runner.invoke(app, ["gateway", "--help"])
    assert shown.exit_code == 0
    for option in ("--port", "--host", "--duration"):
        assert option in shown.output


def test_a_bad_duration_is_refused_without_joining_ray() -> None:
    result = runner.invoke(app, ["gateway", "--port", "0", "--duration", "soon"])
    assert result.exit_code == 2
    assert "--duration" in result.output


def test_a_port_out_of_range_is_refused() -> None:
    result = runner.invoke(app, ["gateway", "--port", "70000"])
    assert result.exit_code == 2
