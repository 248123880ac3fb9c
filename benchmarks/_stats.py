"""Pure arithmetic of the benchmark suite: percentiles, cell summaries, ratios, the result
schema. No Ray, no I/O: the unit tests (tests/unit/test_bench_*.py) import it directly.

Why a module of its own: the numbers in RESULTS.md must be computed the same way for every
system, and the parts that decide a reported figure are the parts worth testing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SCHEMA_VERSION = 1


class SchemaError(ValueError):
    """A result document does not have the shape RESULTS.md and the chart are built from."""


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (the
    numpy default), so p50 of [1, 2] is 1.5. Raises ValueError on an empty sample or q outside
    0..100: a percentile of nothing must not quietly become 0."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q!r}")
    if not values:
        raise ValueError("percentile of an empty sample")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(seconds: Sequence[float]) -> dict[str, float | int]:
    """p50/p99/p99.9/max in milliseconds and the sample size."""
    if not seconds:
        raise ValueError("latency summary of an empty sample")
    return {
        "count": len(seconds),
        "p50_ms": percentile(seconds, 50) * 1e3,
        "p99_ms": percentile(seconds, 99) * 1e3,
        "p999_ms": percentile(seconds, 99.9) * 1e3,
        "max_ms": max(seconds) * 1e3,
    }


def median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def rates(messages: int, seconds: float, size: int, copies: int = 1) -> dict[str, float]:
    """Messages and megabytes (10^6, bodies only) per second delivered: every copy counts, so a
    topic with 10 subscriptions delivers 10 copies of each message sent."""
    if seconds <= 0:
        raise ValueError(f"elapsed time must be > 0, not {seconds!r}")
    delivered = messages * copies
    return {"msgs_per_s": delivered / seconds, "mb_per_s": delivered * size / seconds / 1e6}


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours ÷ theirs, or None when either side is missing or the peer measured 0."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def cell_key(cell: Mapping[str, Any]) -> tuple[str, int, str]:
    """What makes two systems' cells comparable: scenario, body size and call style."""
    return (str(cell["scenario"]), int(cell["size"]), str(cell["calls"]))


def summarise(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (scenario, size, calls, system): the median msgs/s over rounds (failed
    or skipped rounds excluded, but counted), the latency of the median round, and every
    error. ``skipped`` is set only when no round ran: a cell whose last round the time budget
    cut still reports the rounds that ran.

    A fixed-rate cell (``LATENCY_SCENARIOS``) reports the median of each latency percentile
    over its rounds instead, and of the rate achieved: every round delivers the same rate
    there, so "the median round" was whichever came closest by a message a second (the full
    run of ``28a2297`` reported raybus's round with the highest p99 of three, 26.3 ms against
    11.2 and 21.1, and RabbitMQ's with the lowest, 20.5 against 98.2 and 74.5)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault((*cell_key(r), r["system"]), []).append(r)
    out = []
    for (scenario, size, calls, system), rs in groups.items():
        ok = [r for r in rs if r.get("ok")]
        rate = median(r["msgs_per_s"] for r in ok)
        if scenario in LATENCY_SCENARIOS:
            latency, achieved = _latency_medians(ok), median(r.get("achieved_rate") for r in ok)
        else:
            mid = min(ok, key=lambda r: abs(r["msgs_per_s"] - rate)) if ok else {}
            latency, achieved = mid.get("latency"), mid.get("achieved_rate")
        out.append(
            {
                "scenario": scenario,
                "size": size,
                "calls": calls,
                "system": system,
                "rounds": len(rs),
                "failed_rounds": len(rs) - len(ok),
                "msgs_per_s": rate,
                "mb_per_s": None if rate is None else rate * size / 1e6,
                "latency": latency,
                "achieved_rate": achieved,
                "errors": [r["error"] for r in rs if not r.get("ok") and r.get("error")],
                "skipped": None
                if ok
                else next((r["skipped"] for r in rs if r.get("skipped")), None),
            }
        )
    return out


# Scenarios run at a fixed rate: every system delivers the same msgs/s, so they are compared by
# their p99 send-to-receive latency instead.
LATENCY_SCENARIOS = frozenset({"latency"})


def _latency_medians(rounds: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Each latency statistic's median over ``rounds`` (those that have one)."""
    samples = [r["latency"] for r in rounds if r.get("latency")]
    if not samples:
        return None
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def p99_ms(s: Mapping[str, Any] | None) -> float | None:
    """A summary's p99 latency, or None if it has none (did not run, or failed)."""
    if not s or s.get("msgs_per_s") is None or not s.get("latency"):
        return None
    return float(s["latency"]["p99_ms"])


def ratios(
    summary: Sequence[Mapping[str, Any]], ours: str, peers: Sequence[str]
) -> dict[tuple[str, int, str], dict[str, float | None]]:
    """For every cell ``ours`` ran, against each peer that ran the same cell (None if it did
    not run or failed): ours ÷ peer in msgs/s, or, in a fixed-rate scenario, peer p99 ÷ our
    p99. Either way above 1 means ours did better."""
    by = {(*cell_key(s), s["system"]): s for s in summary}
    out: dict[tuple[str, int, str], dict[str, float | None]] = {}
    for s in summary:
        if s["system"] != ours:
            continue
        key = cell_key(s)
        if key[0] in LATENCY_SCENARIOS:
            out[key] = {p: ratio(p99_ms(by.get((*key, p))), p99_ms(s)) for p in peers}
        else:
            out[key] = {
                p: ratio(s["msgs_per_s"], (by.get((*key, p)) or {}).get("msgs_per_s"))
                for p in peers
            }
    return out


# ---------------------------------------------------------------------------- schema

_RUN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "scenario": str,
    "size": int,
    "calls": str,
    "system": str,
    "round": int,
    "ok": bool,
}
_TOP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "suite": str,
    "started_at": str,
    "duration_s": (int, float),
    "settings": dict,
    "machine": dict,
    "runs": list,
    "summary": list,
    "targets": list,
    "peers_unavailable": dict,
}


def validate_result(doc: Mapping[str, Any]) -> None:
    """Check a suite result document (the JSON written per run); raises SchemaError naming the
    first field that is missing or of the wrong type. Successful runs must carry a positive
    rate; machine facts must include the load average at start and end."""

    def need(obj: Mapping[str, Any], fields: Mapping[str, Any], where: str) -> None:
        for name, typ in fields.items():
            if name not in obj:
                raise SchemaError(f"{where}: missing field {name!r}")
            val = obj[name]
            if isinstance(val, bool) and typ is not bool and bool not in _as_tuple(typ):
                raise SchemaError(f"{where}: field {name!r} must be {typ}, not bool")
            if not isinstance(val, typ):
                raise SchemaError(f"{where}: field {name!r} must be {typ}, not {type(val)}")

    need(doc, _TOP_FIELDS, "result")
    if doc["schema"] != SCHEMA_VERSION:
        raise SchemaError(f"result: schema {doc['schema']!r}, expected {SCHEMA_VERSION}")
    for key in ("cpu_count", "loadavg_start", "loadavg_end", "versions"):
        if key not in doc["machine"]:
            raise SchemaError(f"result.machine: missing field {key!r}")
    for i, run in enumerate(doc["runs"]):
        if not isinstance(run, Mapping):
            raise SchemaError(f"result.runs[{i}]: not an object")
        need(run, _RUN_FIELDS, f"result.runs[{i}]")
        if run["ok"]:
            rate = run.get("msgs_per_s")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
                raise SchemaError(f"result.runs[{i}]: a successful run needs msgs_per_s > 0")
    for i, t in enumerate(doc["targets"]):
        if not isinstance(t, Mapping) or "name" not in t or "status" not in t:
            raise SchemaError(f"result.targets[{i}]: needs name and status")
        if t["status"] not in ("pass", "fail", "not measured"):
            raise SchemaError(f"result.targets[{i}]: status {t['status']!r}")


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)
