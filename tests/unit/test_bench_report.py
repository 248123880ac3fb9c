"""The benchmark suite's reporting (benchmarks/_report.py) and plan (benchmarks/_scenarios.py):
the issue-7 targets, the ratio table, RESULTS.md regeneration. No Ray."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _report
import _scenarios


def _s(
    scenario: str, size: int, calls: str, system: str, rate: float | None, **kw: Any
) -> dict[str, Any]:
    s: dict[str, Any] = {
        "scenario": scenario,
        "size": size,
        "calls": calls,
        "system": system,
        "msgs_per_s": rate,
        "mb_per_s": None if rate is None else rate * size / 1e6,
        "latency": None,
        "achieved_rate": None,
        "errors": [],
        "skipped": None,
    }
    s.update(kw)
    return s


def _all_met() -> list[dict[str, Any]]:
    lat = {"p50_ms": 1.5, "p99_ms": 12.0, "p999_ms": 30.0}
    return [
        _s("throughput", 1024, "batch", "raybus", 60_000.0),
        _s("throughput", 1024, "batch", "rabbitmq", 20_000.0),
        _s("throughput", 1024, "batch", "actor", 100_000.0),
        _s("throughput", 65536, "batch", "raybus", 1000.0),  # 65.5 MB/s
        _s("senders100", 1024, "single", "raybus", 5000.0),
        _s("senders100", 1024, "single", "rayqueue", 400.0),
        _s("latency", 1024, "single", "raybus", 1000.0, latency=lat, achieved_rate=998.0),
    ]


def _status(targets: list[dict[str, Any]]) -> list[str]:
    return [t["status"] for t in targets]


def test_every_target_passes_when_every_number_is_met() -> None:
    targets = _report.evaluate_targets(_all_met())
    assert _status(targets) == ["pass"] * 6
    assert targets[2]["measured"] == "12.5x"
    assert "65.5 MB/s" in targets[4]["measured"]


def test_each_target_fails_on_its_own_number() -> None:
    base = _all_met()
    cases = {
        0: ("throughput", 1024, "batch", "raybus", 49_999.0),
        1: ("throughput", 1024, "batch", "rabbitmq", 61_000.0),
        2: ("senders100", 1024, "single", "rayqueue", 501.0),
        3: ("throughput", 1024, "batch", "actor", 200_001.0),
        4: ("throughput", 65536, "batch", "raybus", 700.0),
    }
    for index, (sc, size, calls, system, rate) in cases.items():
        summary = [
            _s(sc, size, calls, system, rate)
            if (s["scenario"], s["size"], s["calls"], s["system"]) == (sc, size, calls, system)
            else s
            for s in base
        ]
        statuses = _status(_report.evaluate_targets(summary))
        assert statuses[index] == "fail", (index, statuses)
        assert statuses.count("fail") == 1 or index in (0, 4), statuses


def test_latency_target_needs_both_p50_and_p99() -> None:
    for lat in ({"p50_ms": 2.5, "p99_ms": 5.0}, {"p50_ms": 1.0, "p99_ms": 25.0}):
        summary = [s if s["scenario"] != "latency" else {**s, "latency": lat} for s in _all_met()]
        assert _report.evaluate_targets(summary)[5]["status"] == "fail"


def test_a_target_whose_cells_did_not_run_is_not_measured_never_passed() -> None:
    targets = _report.evaluate_targets([])
    assert _status(targets) == ["not measured"] * 6
    failed = [_s("throughput", 1024, "batch", "raybus", None, errors=["x"])]
    assert _report.evaluate_targets(failed)[0]["status"] == "not measured"


def test_rabbitmq_target_reports_the_worst_cell() -> None:
    summary = [
        *_all_met(),
        _s("receivers8", 1024, "batch", "raybus", 100.0),
        _s("receivers8", 1024, "batch", "rabbitmq", 400.0),
    ]
    t = _report.evaluate_targets(summary)[1]
    assert t["status"] == "fail"
    assert (
        "1 of 2 cells" in t["measured"]
        and "0.25x" in t["measured"]
        and "receivers8" in t["measured"]
    )


def test_ratio_table_has_a_row_per_cell_with_raybus_over_each_peer() -> None:
    summary = [
        _s("throughput", 1024, "batch", "raybus", 3000.0),
        _s("throughput", 1024, "batch", "rabbitmq", 1000.0),
        _s("throughput", 1024, "batch", "actor", 6000.0),
        _s("throughput", 1024, "batch", "rayqueue", None, skipped="peer unavailable"),
        _s(
            "throughput", 100, "single", "raybus", None, errors=["Traceback\n  ...\nValueError: no"]
        ),
        _s("throughput", 100, "single", "actor", 50.0),
    ]
    table = _report.ratio_table(summary, {"throughput": "High-throughput queue: 1 sender"})
    lines = table.splitlines()
    assert len(lines) == 4  # header, rule, two cells
    assert all(ln.count("|") == lines[0].count("|") for ln in lines)
    row = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert row[:5] == ["High-throughput queue", "1 KiB", "batch", "3,000", "3.1"]
    assert row[5:] == ["1,000", "3.00x", "6,000", "0.50x", "not run (peer unavailable)", "—"]
    failed = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert failed[3] == "FAILED" and failed[5] == "not run" and failed[8] == "—"
    detail = _report.detail_table(summary)
    assert "ValueError: no" in detail  # the line of the error that says what went wrong


def test_results_md_keeps_the_hand_written_notes() -> None:
    doc = {
        "started_at": "2026-11-30 12:00:00",
        "duration_s": 100.0,
        "settings": {"profile": "quick", "command": "python benchmarks/suite.py --quick"},
        "machine": {
            "cpu_count": 2,
            "loadavg_start": [1.0, 2.0, 3.0],
            "loadavg_end": [4.0, 5.0, 6.0],
            "versions": {"ray": "2"},
        },
        "summary": _all_met(),
        "targets": _report.evaluate_targets(_all_met()),
        "peers_unavailable": {"rabbitmq": "not root"},
        "runs": [{"loadavg_1m": x} for x in (9.0, 3.0, 30.0)] + [{"skipped": "budget"}],
    }
    text = _report.results_md(
        [("Quick run", doc, "published/suite-quick.png")], {"throughput": "T"}, "My notes.\n"
    )
    assert "## Quick run" in text and "published/suite-quick.png" in text
    assert "at start: 1.00, 2.00, 3.00; at end: 4.00, 5.00, 6.00" in text
    assert "rabbitmq: not root" in text
    assert "each run: min 3.0, median 9.0, max 30.0" in text
    assert _report.split_notes(text).strip() == "My notes."
    again = _report.results_md([], {}, _report.split_notes(text))
    assert _report.split_notes(again).strip() == "My notes."


def test_plan_covers_the_issue_scenarios_and_leaves_out_unavailable_peers() -> None:
    plan = _scenarios.build_plan("full", exclude={"rabbitmq", "rabbitmq-rd"})
    cells = {(c["scenario"], c["size"], c["calls"]) for c in plan}
    for size in (100, 1024, 65536):
        assert ("throughput", size, "batch") in cells and ("throughput", size, "single") in cells
    assert {c["scenario"] for c in plan} == set(_scenarios.SCENARIOS)
    assert plan[-1]["scenario"] == "topic100"  # the costly one last, under the budget's reserve
    for c in plan:
        assert "rabbitmq" not in c["systems"]
        assert c["skipped"].get("rabbitmq") in (None, "peer unavailable")
        assert c["n"] >= 100
    latency = next(c for c in plan if c["scenario"] == "latency")
    assert latency["rate"] == 1000 and latency["n"] == 5000 and latency["calls"] == "single"
    big = next(
        c
        for c in plan
        if c["scenario"] == "throughput" and c["size"] == 65536 and c["calls"] == "batch"
    )
    assert big["n"] * 65536 <= _scenarios.PROFILES["full"]["bytes_cap"]


def test_quick_plan_runs_the_cells_of_the_targets_before_the_budget_can_cut_them() -> None:
    plan = _scenarios.build_plan("quick")
    order = [(c["scenario"], c["size"], c["calls"]) for c in plan]
    assert order[:4] == [
        ("throughput", 1024, "batch"),
        ("throughput", 65536, "batch"),
        ("latency", 1024, "single"),
        ("senders100", 1024, "single"),
    ]
    assert order[-1] == ("throughput", 1024, "single")


def test_plan_rejects_unknown_scenarios_and_tiny_bodies() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        _scenarios.build_plan("quick", ["nope"])
    with pytest.raises(ValueError, match=">= 64 bytes"):
        _scenarios.build_plan("quick", None, [32])
    only = _scenarios.build_plan("quick", ["receivers8"], [100])
    assert [(c["scenario"], c["size"], c["calls"]) for c in only] == [("receivers8", 100, "batch")]


def test_latency_cells_have_their_own_table_and_stay_out_of_the_rate_table() -> None:
    summary = [
        *_all_met(),
        _s(
            "latency",
            1024,
            "single",
            "rabbitmq",
            990.0,
            latency={"p50_ms": 3.0, "p99_ms": 24.0, "p999_ms": 40.0},
            achieved_rate=991.0,
        ),
    ]
    assert "Low latency" not in _report.ratio_table(summary, {"latency": "Low latency: x"})
    lines = _report.latency_table(summary).splitlines()
    assert len(lines) == 4
    rb = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert rb == [
        "1 KiB",
        "raybus durable, peek-lock + complete",
        "998",
        "1.50",
        "12.00",
        "30.00",
        "",
    ]
    rmq = [c.strip() for c in lines[3].split("|")[1:-1]]
    assert rmq[2:] == ["991", "3.00", "24.00", "40.00", "2.00x"]
    # The RabbitMQ target counts the latency cell by p99: 24 ms against raybus's 12 ms.
    t = _report.evaluate_targets(summary)[1]
    assert t["status"] == "pass" and "2 of 2 cells" in t["measured"]


def test_variants_table_compares_each_raybus_mode_with_rabbitmq_in_the_same_settle_mode() -> None:
    summary = [
        _s("throughput", 1024, "batch", "raybus", 500.0),
        _s("throughput", 1024, "batch", "raybus-express", 2000.0),
        _s("throughput", 1024, "batch", "raybus-rd", 900.0),
        _s("throughput", 1024, "batch", "rabbitmq", 1000.0),
        _s("throughput", 1024, "batch", "rabbitmq-rd", 3000.0),
    ]
    lines = _report.variants_table(summary).splitlines()
    row = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert row == [
        "throughput",
        "1 KiB",
        "batch",
        "500 (0.50x)",
        "2,000 (2.00x)",
        "900 (0.30x)",
        "",
    ]
    assert _report.variants_table(summary[:1]) == "(no variants run)"


def test_a_rate_from_fewer_rounds_than_planned_says_so() -> None:
    assert _report._rate_cell({"msgs_per_s": 200.0, "rounds": 3, "failed_rounds": 1}) == (
        "200 (2 of 3 rounds)"
    )
    assert _report._rate_cell({"msgs_per_s": 1500.0, "rounds": 3, "failed_rounds": 0}) == "1,500"
    assert _report._rate_cell({"msgs_per_s": None, "rounds": 3, "failed_rounds": 3}) == "FAILED"
