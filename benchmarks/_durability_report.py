"""The summaries and Markdown tables of ``durability.py`` (rates by mode and pattern,
recovery and compaction), and the one-line log of a run.

Imported by ``durability.py`` as ``_durability_report``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from _common import median

MODES = ("memory", "durable", "express")  # the storage modes, in the order of the tables
FILL_BATCH = 1000  # messages per send when a queue is filled


def log_run(rec: dict[str, Any]) -> None:
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}
    print(f"  {shown}", file=sys.stderr)


# ---------------------------------------------------------------------------- reporting


def summarise_rates(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pattern, mode): medians over rounds; ratio = median of per-round ratios."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["pattern"], r["mode"]), {})[r["round"]] = r
    rows = []
    for pattern in dict.fromkeys(r["pattern"] for r in runs):
        base = by.get((pattern, "memory"), {})
        for mode in MODES:
            cells = by.get((pattern, mode), {})
            ok = [r for r in cells.values() if r.get("ok")]
            ratios = [
                r["msgs_per_s"] / base[k]["msgs_per_s"]
                for k, r in cells.items()
                if r.get("ok") and base.get(k, {}).get("ok")
            ]
            fl = [r for r in ok if r["flushes"]]
            rows.append(
                {
                    "pattern": pattern,
                    "mode": mode,
                    "rounds_ok": len(ok),
                    "rounds": len(cells),
                    "messages": median([r["messages"] for r in ok]),
                    "seconds": median([r["seconds"] for r in ok]),
                    "msgs_per_s": median([r["msgs_per_s"] for r in ok]),
                    "ratio_vs_memory": median(ratios),
                    "flushes_per_s": median([r["flushes"] / r["seconds"] for r in fl])
                    if mode != "memory"
                    else None,
                    "msgs_per_flush": median([r["messages"] / r["flushes"] for r in fl])
                    if mode != "memory"
                    else None,
                    "entries_per_flush": median([r["flushed_entries"] / r["flushes"] for r in fl])
                    if mode != "memory"
                    else None,
                }
            )
    return rows


def fmt(x: float | None, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def rates_table(rows: list[dict[str, Any]], label: Callable[[str], str]) -> str:
    out = [
        "| scenario | mode | msgs/s | ÷ memory | flushes/s | msgs/flush | rounds ok |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        failed = r["rounds_ok"] < r["rounds"]
        out.append(
            f"| {label(r['pattern'])} | {r['mode']} | {fmt(r['msgs_per_s'], ',.0f', 'FAILED')} | "
            f"{fmt(r['ratio_vs_memory'], '.2f')} | {fmt(r['flushes_per_s'], ',.1f')} | "
            f"{fmt(r['msgs_per_flush'], ',.1f')} | {r['rounds_ok']}/{r['rounds']}"
            f"{' FAILED' if failed else ''} |"
        )
    return "\n".join(out)


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.1f} MiB"


def recovery_table(rec: dict[str, Any], comp: dict[str, Any]) -> str:
    out = ["| measurement | value |", "|---|---:|"]
    n = rec["messages"]
    if rec.get("fill_s") is not None:
        out.append(
            f"| fill {n:,} durable messages (lists of {FILL_BATCH}) | {rec['fill_s']:.1f} s "
            f"({rec['fill_msgs_per_s']:,.0f} msgs/s) |"
        )
    if rec.get("disk"):
        d = rec["disk"]
        out.append(
            f"| disk before the kill | {mib(d['bytes'])} in {d['files']:,} files "
            f"({d['bytes'] / n:,.0f} B/msg) |"
        )
    if rec.get("ok"):
        every = ", ".join(f"{x:.2f}" for x in rec["recovery_s_all"])
        out.append(
            f"| **recovery of {n:,} messages** (kill → count answers; median of "
            f"{len(rec['recovery_s_all'])}: {every} s) | **{rec['recovery_s']:.2f} s** |"
        )
        if comp.get("ok"):
            replay = rec["recovery_s"] - comp["restart_drained_s"]
            out.append(
                "| recovery minus the restart of a drained queue (≈ reading + replaying the log) "
                f"| {replay:.2f} s ({n / max(replay, 1e-9):,.0f} msgs/s) |"
            )
        if bd := rec.get("breakdown"):
            out.append(
                f"| the same steps timed in this process ({bd['files']:,} files): read + check + "
                f"decode {bd['read_decode_s']:.2f} s, journal.from_table "
                f"{bd['from_table_s']:.2f} s, journal.replay {bd['replay_s']:.2f} s, "
                f"Partition.load {bd['load_s']:.2f} s | {bd['total_s']:.2f} s |"
            )
            if off := bd.get("gc_disabled"):
                out.append(
                    "| the same with Python's garbage collector disabled: read "
                    f"{off['read_decode_s']:.2f} s, from_table {off['from_table_s']:.2f} s, "
                    f"replay {off['replay_s']:.2f} s, load {off['load_s']:.2f} s "
                    f"| {off['total_s']:.2f} s |"
                )
    else:
        out.append(f"| recovery of {n:,} messages | FAILED: {rec.get('error')} |")
    m = comp["messages"]
    for key, what in (
        ("disk_empty_queue", "disk, new empty queue"),
        ("disk_full", f"disk, {m:,} messages queued"),
        ("disk_peak_during_drain", "disk, peak while draining (sampled)"),
        ("disk_drained", "disk, drained (receive 100 + complete_messages)"),
    ):
        if comp.get(key):
            d = comp[key]
            out.append(f"| {what} | {mib(d['bytes'])} in {d['files']:,} files |")
    if comp.get("drain_s") is not None:
        out.append(
            f"| drain {m:,} durable messages | {comp['drain_s']:.1f} s "
            f"({comp['drain_msgs_per_s']:,.0f} msgs/s) |"
        )
    if comp.get("ok"):
        out.append(
            "| restart of the drained queue (kill → count answers) | "
            f"{comp['restart_drained_s']:.2f} s |"
        )
    elif comp.get("error"):
        out.append(f"| compaction | FAILED: {comp['error']} |")
    return "\n".join(out)
