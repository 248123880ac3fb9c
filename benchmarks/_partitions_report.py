"""The analysis and tables of ``partitions.py``: the pause scenario's latencies, gaps and
exactly-once check (``analyse_pause``), the throughput summary (medians over repeats, ratios
per repeat) and the Markdown tables.

Imported by ``partitions.py`` as ``_partitions_report``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from _common import median, progress

PARTITION_COUNTS = (1, 2, 4, 8)  # the partition counts measured, in order


def pct(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of xs by the nearest-rank method."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def analyse_pause(
    *,
    mode: str,
    received: list[tuple[int, float, float]],
    acked: set[int],
    attempted: int,
    ack_lat: list[tuple[float, float]],
    send_errors: list[str],
    changes: list[dict[str, Any]],
    t0: float,
    t_send_end: float,
    lateness: float,
    leftover: int,
    active_after: int,
    cpu: dict[str, float],
    cpu_samples: list[tuple[float, dict[str, float]]],
    wall: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    counts = Counter(i for i, _s, _r in received)
    dup = sum(c - 1 for c in counts.values() if c > 1)
    lost = len(acked - counts.keys())
    unexpected = len(counts.keys() - set(range(attempted)))
    unacked_arrived = len((counts.keys() - acked) & set(range(attempted)))
    ok = not dup and not lost and not unexpected and not active_after
    summary = (
        f"{len(acked)} sent and acknowledged ({len(send_errors)} send errors), "
        f"{len(counts)} distinct received, {dup} duplicated, {lost} lost"
        + (f", {unexpected} unexpected" if unexpected else "")
        + (f", {unacked_arrived} arrived though their send failed" if unacked_arrived else "")
        + (f", {active_after} left in the queue" if active_after else "")
        + (" -> OK" if ok else " -> FAILED")
    )
    margin = 1.0  # a change's window: its update_queue call to 1 s after wait_for_partitions
    warm = t0 + 0.5
    # A window ends where the next change begins, if that is sooner.
    starts = [c["t_call"] for c in changes[1:]] + [float("inf")]
    windows = [
        (c["t_call"], min(c["t_waited"] + margin, nxt))
        for c, nxt in zip(changes, starts, strict=True)
    ]

    def in_windows(t: float) -> bool:
        return any(a <= t <= z for a, z in windows)

    recv_times = sorted({r for _i, _s, r in received})
    gaps = list(itertools.pairwise(recv_times))

    def period(
        label: str, pick: Callable[[float], bool], gap_pick: Callable[[float, float], bool]
    ) -> dict[str, Any]:
        lat = [(r - s) * 1000 for _i, s, r in received if pick(s)]
        acks = [a * 1000 for s, a in ack_lat if pick(s)]
        g = [(z - a) * 1000 for a, z in gaps if gap_pick(a, z)]
        return {
            "period": label,
            "messages": len(lat),
            "latency_ms_p50": pct(lat, 0.5),
            "latency_ms_p99": pct(lat, 0.99),
            "latency_ms_max": max(lat) if lat else None,
            "send_ack_ms_max": max(acks) if acks else None,
            "longest_gap_ms": max(g) if g else None,
            "gap_ms_p99": pct(g, 0.99),
        }

    periods = [
        period(
            "steady (outside the change windows)",
            lambda s: warm <= s <= t_send_end and not in_windows(s),
            lambda a, z: (
                warm <= a and z <= t_send_end and not any(a <= wz and z >= wa for wa, wz in windows)
            ),
        )
    ]
    for c, (wa, wz) in zip(changes, windows, strict=True):
        periods.append(
            period(
                f"{c['from']} -> {c['to']} partitions ({wa - t0:.1f} s to {wz - t0:.1f} s)",
                lambda s, wa=wa, wz=wz: wa <= s <= wz,
                lambda a, z, wa=wa, wz=wz: a <= wz and z >= wa,
            )
        )
    periods.append(
        period(
            "whole run",
            lambda s: warm <= s <= t_send_end,
            lambda a, z: warm <= a and z <= t_send_end,
        )
    )
    # Timeline in 100 ms bins of receive time (for plots): count and max latency.
    bins: dict[int, list[float]] = {}
    for _i, s, r in received:
        bins.setdefault(int((r - t0) * 10), []).append((r - s) * 1000)
    cpu_bins = {int((t - t0) * 10 - 0.5): c for t, c in cpu_samples}  # sample ends ~ bin end
    timeline = [
        {
            "t_s": k / 10,
            "received": len(bins.get(k, ())),
            "latency_ms_max": round(max(bins[k]), 2) if k in bins else None,
            "cpu_cores": cpu_bins.get(k),
        }
        for k in sorted(bins.keys() | cpu_bins.keys())
        if k >= 0
    ]
    # Where the CPU went while receivers waited longest (the longest gap of each change).
    for c, (wa, wz) in zip(changes, windows, strict=True):
        inside = [(z - a, a, z) for a, z in gaps if a <= wz and z >= wa]
        if inside:
            _g, a, z = max(inside)
            # Samples whose 0.1 s interval overlaps the gap.
            during = [cc for t, cc in cpu_samples if t >= a and t - 0.1 <= z]
            keys = {k for cc in during for k in cc}
            c["longest_gap_at_s"] = round(a - t0, 3)
            c["cpu_cores_during_longest_gap"] = {
                k: round(statistics.mean(cc.get(k, 0.0) for cc in during), 2) for k in sorted(keys)
            }
    for c in changes:
        c["at_s"] = round(c["at_s"], 3)
    return {
        "mode": mode,
        "ok": ok,
        "settings": settings,
        "changes": [
            {k: v for k, v in c.items() if k not in ("t_call", "t_waited")} for c in changes
        ],
        "periods": periods,
        "check": {
            "ok": ok,
            "summary": summary,
            "sent_acknowledged": len(acked),
            "attempted": attempted,
            "send_errors": len(send_errors),
            "send_error_samples": send_errors[:5],
            "received_distinct": len(counts),
            "received_total": len(received),
            "duplicates": dup,
            "lost": lost,
            "unexpected": unexpected,
            "arrived_without_ack": unacked_arrived,
            "received_after_run": leftover,
            "active_after": active_after,
        },
        "sender_max_lateness_ms": lateness * 1000,
        "wall_s": wall,
        "cpu_cores": cpu,
        "timeline": timeline,
    }


def log_cell(rec: dict[str, Any]) -> None:
    if not rec.get("ok"):
        return
    n = rec["messages"]
    progress(
        f"  {rec['mode']:8s} {rec['system']:6s} P={rec['partitions']} rep {rec['repeat']}: "
        f"send {n / rec['send_s']:8,.0f}/s  receive+complete {n / rec['recv_s']:8,.0f}/s  "
        f"spread {rec['per_partition']}"
    )


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cells = [r for r in runs if r.get("kind") == "throughput"]
    modes = list(dict.fromkeys(r["mode"] for r in cells))
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for phase, key in (("send", "send_s"), ("receive+complete", "recv_s")):
            rate: dict[tuple[str, int], dict[int, float]] = {}
            cpu: dict[tuple[str, int], list[dict[str, float]]] = {}
            failed: set[tuple[str, int]] = set()
            calls: dict[tuple[str, int], list[float]] = {}  # actor calls per 100 messages
            for r in cells:
                if r["mode"] != mode:
                    continue
                k = (r["system"], r["partitions"])
                if not r.get("ok"):
                    failed.add(k)
                    continue
                rate.setdefault(k, {})[r["repeat"]] = r["messages"] / r[key]
                cpu.setdefault(k, []).append(r[f"{key[:4]}_cpu"])
                made = r.get(f"{key[:4]}_actor_calls")
                if made is not None:
                    calls.setdefault(k, []).append(100 * sum(made.values()) / r["messages"])

            def ratios(a: dict[int, float], b: dict[int, float]) -> list[float]:
                return [a[k] / b[k] for k in a if b.get(k)]

            for p in PARTITION_COUNTS:
                rb, ba = rate.get(("raybus", p), {}), rate.get(("bare", p), {})
                rb1, ba1 = rate.get(("raybus", 1), {}), rate.get(("bare", 1), {})
                rows.append(
                    {
                        "mode": mode,
                        "phase": phase,
                        "partitions": p,
                        "raybus_msgs_per_s": median(list(rb.values())),
                        "raybus_range": [min(rb.values()), max(rb.values())] if rb else None,
                        "raybus_vs_p1": median(ratios(rb, rb1)),
                        "bare_msgs_per_s": median(list(ba.values())),
                        "bare_vs_p1": median(ratios(ba, ba1)),
                        "raybus_vs_bare": median(ratios(rb, ba)),
                        "raybus_calls_per_100": median(calls.get(("raybus", p), [])),
                        "bare_calls_per_100": median(calls.get(("bare", p), [])),
                        "raybus_cpu_cores": cpu_median(cpu.get(("raybus", p), [])),
                        "bare_cpu_cores": cpu_median(cpu.get(("bare", p), [])),
                        "repeats": len(rb),
                        "failed": [s for s, q in failed if q == p],
                    }
                )
    return rows


def cpu_median(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for s in samples for k in s}
    return {k: round(statistics.median(s.get(k, 0.0) for s in samples), 2) for k in sorted(keys)}


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def cpu_str(c: dict[str, float], actors: str) -> str:
    if not c:
        return "—"
    return (
        f"{c.get('driver', 0):.2f} / {c.get(actors, 0):.2f} / "
        f"{c.get('ray', 0) + c.get('registry', 0):.2f} / {fmt(c.get('others'), '.2f')}"
    )


def markdown_throughput(rows: list[dict[str, Any]]) -> str:
    out = [
        "| storage | phase | P | raybus msgs/s | ÷ P=1 | bare msgs/s | bare ÷ P=1 "
        "| raybus ÷ bare | actor calls per 100 msgs: raybus / bare "
        "| CPU cores raybus: driver / partitions / ray / others "
        "| CPU cores bare: driver / actors / ray / others |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        failed = f" (FAILED: {', '.join(r['failed'])})" if r["failed"] else ""
        out.append(
            f"| {r['mode']} | {r['phase']} | {r['partitions']} | "
            f"{fmt(r['raybus_msgs_per_s'], ',.0f')}{failed} | {fmt(r['raybus_vs_p1'], '.2f')} | "
            f"{fmt(r['bare_msgs_per_s'], ',.0f')} | {fmt(r['bare_vs_p1'], '.2f')} | "
            f"{fmt(r['raybus_vs_bare'], '.2f')} | "
            f"{fmt(r['raybus_calls_per_100'], '.1f')} / {fmt(r['bare_calls_per_100'], '.1f')} | "
            f"{cpu_str(r['raybus_cpu_cores'], 'partitions')} | "
            f"{cpu_str(r['bare_cpu_cores'], 'bare')} |"
        )
    return "\n".join(out)


def markdown_pause(pauses: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for p in pauses:
        if "periods" not in p:
            out.append(f"**{p['mode']}**: pause scenario FAILED: {p.get('error')}")
            continue
        s = p["settings"]
        out.append(
            f"**{p['mode']}**: {s['rate']:g} msgs/s in lists of {s['batch']} ({s['body']} B "
            f"bodies) for {s['seconds']:g} s; one receiver (receive 100 + complete_messages)"
        )
        out.append("")
        out.append(
            "| period (by send time) | messages | latency p50 ms | p99 ms | max ms "
            "| longest receive gap ms | send ack max ms |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for per in p["periods"]:
            out.append(
                f"| {per['period']} | {per['messages']} | {fmt(per['latency_ms_p50'], '.1f')} | "
                f"{fmt(per['latency_ms_p99'], '.1f')} | {fmt(per['latency_ms_max'], '.1f')} | "
                f"{fmt(per['longest_gap_ms'], '.1f')} | {fmt(per['send_ack_ms_max'], '.1f')} |"
            )
        out.append("")
        for c in p["changes"]:
            out.append(
                f"- {c['from']} -> {c['to']} partitions at {c['at_s']:.1f} s: update_queue "
                f"returned after {c['update_queue_s']:.2f} s, wait_for_partitions after "
                f"{c['wait_for_partitions_s']:.2f} s ({c['live_after_wait']} live; map v"
                f"{c['map_version_before']} -> v{c['map_version_after']})"
            )
        cpu = p["cpu_cores"]
        for c in p["changes"]:
            if "cpu_cores_during_longest_gap" in c:
                cc = c["cpu_cores_during_longest_gap"]
                out.append(
                    f"- {c['from']} -> {c['to']}: the longest gap began at "
                    f"{c['longest_gap_at_s']:.2f} s; CPU cores meanwhile: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in cc.items())
                )
        out.append(
            f"- check: {p['check']['summary']}; sender at most "
            f"{p['sender_max_lateness_ms']:.0f} ms behind its schedule; CPU cores: "
            + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        )
        out.append("")
    return "\n".join(out).rstrip()


def report_text(
    args: Any, facts: dict[str, Any], rows: list[dict[str, Any]], pauses: list[dict[str, Any]]
) -> str:
    """The run's Markdown: the throughput table (``rows`` of ``summarise``), then the pauses."""
    table = markdown_throughput(rows)
    pause_md = markdown_pause(pauses)
    cores = f"{facts.get('cpu_count')} CPUs ({facts.get('cpu_affinity')} usable)"
    return (
        f"### Throughput by partition count ({args.messages} x {args.body_size} B per cell, "
        f"{args.senders} senders / {args.receivers} receivers, medians of {args.repeats}; "
        f"{cores})\n\n{table}\n\n### Pause during partition changes\n\n{pause_md}"
    )
