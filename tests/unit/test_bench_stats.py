"""The benchmark suite's arithmetic (benchmarks/_stats.py): percentiles, rates, per-cell
summaries, ratios and the result schema. No Ray: the module is pure."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _stats
from _peer_base import HEADER, make_body, parse_body


def test_percentile_interpolates_between_closest_ranks() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert _stats.percentile(xs, 0) == 1.0
    assert _stats.percentile(xs, 100) == 4.0
    assert _stats.percentile(xs, 50) == pytest.approx(2.5)
    assert _stats.percentile(xs, 25) == pytest.approx(1.75)
    assert _stats.percentile([7.0], 99.9) == 7.0


def test_percentile_of_a_large_sample_matches_the_rank_definition() -> None:
    xs = [float(i) for i in range(1, 1001)]  # 1..1000
    assert _stats.percentile(xs, 99) == pytest.approx(990.01)
    assert _stats.percentile(xs, 99.9) == pytest.approx(999.001)


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_outside_0_100_is_an_error(q: float) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        _stats.percentile([1.0, 2.0], q)


def test_percentile_of_nothing_is_an_error_not_zero() -> None:
    with pytest.raises(ValueError, match="empty"):
        _stats.percentile([], 50)
    with pytest.raises(ValueError, match="empty"):
        _stats.latency_summary([])


def test_latency_summary_is_in_milliseconds() -> None:
    s = _stats.latency_summary([0.001] * 999 + [0.5])
    assert s["count"] == 1000
    assert s["p50_ms"] == pytest.approx(1.0)
    assert s["p99_ms"] == pytest.approx(1.0)
    assert s["p999_ms"] == pytest.approx(1.0 + 0.001 * 499 * 0.999, rel=0.01)
    assert s["max_ms"] == pytest.approx(500.0)


def test_rates_count_every_copy_a_topic_delivers() -> None:
    r = _stats.rates(1000, 2.0, 1024)
    assert r == {"msgs_per_s": 500.0, "mb_per_s": pytest.approx(0.512)}
    r10 = _stats.rates(1000, 2.0, 1024, copies=10)
    assert r10["msgs_per_s"] == 5000.0
    with pytest.raises(ValueError, match="> 0"):
        _stats.rates(10, 0.0, 100)


def test_ratio_is_none_when_a_side_is_missing_or_zero() -> None:
    assert _stats.ratio(10.0, 4.0) == 2.5
    assert _stats.ratio(None, 4.0) is None
    assert _stats.ratio(10.0, None) is None
    assert _stats.ratio(10.0, 0.0) is None


def _run(system: str, rate: float | None, rnd: int = 0, **kw: object) -> dict[str, object]:
    r: dict[str, object] = {
        "scenario": "throughput",
        "size": 1024,
        "calls": "batch",
        "system": system,
        "round": rnd,
        "ok": rate is not None,
    }
    if rate is not None:
        r["msgs_per_s"] = rate
        r["latency"] = {"p50_ms": rate / 1000}
    else:
        r["error"] = "boom"
    r.update(kw)
    return r


def test_summary_takes_the_median_round_and_keeps_failures() -> None:
    runs = [
        _run("raybus", 100.0, 0),
        _run("raybus", 300.0, 1),
        _run("raybus", 200.0, 2),
        _run("rabbitmq", None, 0),
        _run("rabbitmq", 50.0, 1),
    ]
    summary = {s["system"]: s for s in _stats.summarise(runs)}
    rb = summary["raybus"]
    assert rb["msgs_per_s"] == 200.0
    assert rb["mb_per_s"] == pytest.approx(200 * 1024 / 1e6)
    assert rb["latency"] == {"p50_ms": 0.2}  # from the median round, not the best
    assert rb["rounds"] == 3 and rb["failed_rounds"] == 0
    rmq = summary["rabbitmq"]
    assert rmq["msgs_per_s"] == 50.0
    assert rmq["failed_rounds"] == 1 and rmq["errors"] == ["boom"]


def test_a_fixed_rate_cell_reports_each_percentiles_median_over_its_rounds() -> None:
    """Every round of the latency cell delivers the same rate: the round closest to the
    median rate said nothing about its latency. Each percentile is the median of the
    rounds' (failed rounds left out), and so is the rate achieved."""

    def latency_run(rnd: int, rate: float, p50: float, p99: float) -> dict[str, object]:
        return _run(
            "raybus",
            rate,
            rnd,
            scenario="latency",
            calls="single",
            latency={"count": 5000, "p50_ms": p50, "p99_ms": p99},
            achieved_rate=rate,
        )

    runs = [
        latency_run(0, 997.0, 2.17, 26.3),
        latency_run(1, 998.0, 3.63, 11.17),
        latency_run(2, 995.0, 4.6, 21.07),
        _run("raybus", None, 3, scenario="latency", calls="single"),
    ]
    (s,) = _stats.summarise(runs)
    assert s["latency"] == {"count": 5000, "p50_ms": 3.63, "p99_ms": 21.07}
    assert s["achieved_rate"] == 997.0 and s["failed_rounds"] == 1
    (throughput,) = _stats.summarise([_run("raybus", 100.0, 0), _run("raybus", 300.0, 1)])
    assert throughput["latency"] == {"p50_ms": 0.1}  # a rate cell: its median round's


def test_a_cell_the_budget_cut_short_reports_the_rounds_that_ran() -> None:
    """A round skipped for the time budget does not hide the rounds that ran (the cell was
    shown as not run although two of its three rounds had run)."""
    budget = {"ok": False, "skipped": "time budget of 1020 s used up"}
    runs = [_run("raybus", 100.0, 0), _run("raybus", 300.0, 1), _run("raybus", None, 2, **budget)]
    (s,) = _stats.summarise(runs)
    assert s["msgs_per_s"] == 200.0 and s["skipped"] is None
    assert (s["rounds"], s["failed_rounds"]) == (3, 1)
    (none,) = _stats.summarise([_run("actor", None, 0, **budget)])
    assert none["msgs_per_s"] is None and none["skipped"] == budget["skipped"]


def test_summary_of_only_failed_rounds_has_no_rate() -> None:
    (s,) = _stats.summarise([_run("actor", None)])
    assert s["msgs_per_s"] is None and s["mb_per_s"] is None and s["latency"] is None


def test_ratios_compare_only_the_same_cell() -> None:
    runs = [
        _run("raybus", 300.0),
        _run("rabbitmq", 100.0),
        _run("raybus", 10.0, size=65536),
        _run("actor", 40.0, size=65536),
    ]
    vs = _stats.ratios(_stats.summarise(runs), "raybus", ["rabbitmq", "actor"])
    assert vs[("throughput", 1024, "batch")] == {"rabbitmq": 3.0, "actor": None}
    assert vs[("throughput", 65536, "batch")] == {"rabbitmq": None, "actor": 0.25}


def test_fixed_rate_cells_compare_p99_latency_not_rate() -> None:
    runs = [
        _run("raybus", 1000.0, scenario="latency", calls="single", latency={"p99_ms": 5.0}),
        _run("rabbitmq", 990.0, scenario="latency", calls="single", latency={"p99_ms": 20.0}),
        _run("actor", None, scenario="latency", calls="single"),
    ]
    vs = _stats.ratios(_stats.summarise(runs), "raybus", ["rabbitmq", "actor"])
    # rabbitmq's p99 is 4x raybus's: raybus did 4x better; the failed actor has no ratio.
    assert vs[("latency", 1024, "single")] == {"rabbitmq": 4.0, "actor": None}


def _doc() -> dict[str, object]:
    return {
        "schema": _stats.SCHEMA_VERSION,
        "suite": "raybus-peers",
        "started_at": "2026-11-30 12:00:00",
        "duration_s": 12.5,
        "settings": {"profile": "quick"},
        "machine": {
            "cpu_count": 2,
            "loadavg_start": [1, 1, 1],
            "loadavg_end": [2, 2, 2],
            "versions": {},
        },
        "runs": [_run("raybus", 100.0), _run("actor", None)],
        "summary": [],
        "targets": [{"name": "t", "measured": "x", "status": "pass"}],
        "peers_unavailable": {},
    }


def test_a_complete_result_document_validates() -> None:
    _stats.validate_result(_doc())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("runs"), "missing field 'runs'"),
        (lambda d: d.update(schema=99), "schema 99"),
        (lambda d: d["machine"].pop("loadavg_end"), "missing field 'loadavg_end'"),
        (lambda d: d["runs"][0].pop("size"), r"runs\[0\]: missing field 'size'"),
        (lambda d: d["runs"][0].update(size="1024"), "'size' must be"),
        (lambda d: d["runs"][0].update(ok=1), "'ok' must be"),
        (lambda d: d["runs"][0].update(msgs_per_s=0), "msgs_per_s > 0"),
        (lambda d: d["runs"][0].update(msgs_per_s=True), "msgs_per_s > 0"),
        (lambda d: d.update(duration_s=True), "'duration_s' must be"),
        (lambda d: d["targets"][0].update(status="maybe"), "status 'maybe'"),
    ],
)
def test_a_malformed_result_document_names_the_field(mutate: object, message: str) -> None:
    doc = copy.deepcopy(_doc())
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(_stats.SchemaError, match=message):
        _stats.validate_result(doc)


def test_bodies_carry_their_index_and_send_time() -> None:
    body = make_body(12345, 100)
    assert len(body) == 100
    parsed = parse_body(body, 100)
    assert parsed is not None and parsed[0] == 12345 and parsed[1] > 1.7e9
    assert parse_body(body, 101) is None  # wrong size: not intact
    assert parse_body("text", 4) is None
    assert HEADER.size == 16
