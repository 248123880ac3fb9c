"""The units, summary and Markdown table of ``core_throughput.py``: which (system, mode)
pairs run and what each is compared with, medians over rounds and ratios as medians of
per-round ratios, and the notes on settlement (complete one by one against a list).

Imported by ``core_throughput.py`` as ``_core_throughput_report``.
"""

from __future__ import annotations

import statistics
from typing import Any

from _common import md_table, median

# (system, mode): label, description. Order = run order within a round (interleaved).
UNITS: list[tuple[str, str]] = [
    ("raybus", "each"),
    ("actor", "ack"),
    ("raybus", "batch"),
    ("raybus", "delete"),
    ("actor", "delete"),
    ("rayqueue", "delete"),
]
LABELS = {
    ("raybus", "each"): "A1 raybus peek-lock, complete_message one by one",
    ("raybus", "batch"): "A2 raybus peek-lock, complete_messages(batch)",
    ("raybus", "delete"): "A3 raybus receive-and-delete",
    ("actor", "ack"): "B  bare actor get + ack(ids)",
    ("actor", "delete"): "B  bare actor get (no ack)",
    ("rayqueue", "delete"): "C  ray.util.queue get_nowait_batch",
}
# The bare-actor row each raybus row is compared with.
PEER = {"each": ("actor", "ack"), "batch": ("actor", "ack"), "delete": ("actor", "delete")}


def summarise(runs: list[dict[str, Any]], n: int, size: int) -> list[dict[str, Any]]:
    """Table rows: medians over rounds, ratios as medians of per-round ratios."""
    by: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["system"], r["mode"], r["phase"]), []).append(r)

    def series(system: str, mode: str | None, phase: str, key: str) -> dict[int, float]:
        """round -> seconds (median over the modes when mode is None)."""
        per_round: dict[int, list[float]] = {}
        for (s, m, p), rs in by.items():
            if s != system or p != phase or (mode is not None and m != mode):
                continue
            for r in rs:
                if r.get("ok") and key in r:
                    per_round.setdefault(r["round"], []).append(r[key])
        return {k: statistics.median(v) for k, v in per_round.items()}

    def calls(system: str, mode: str | None, phase: str, key: str) -> dict[str, float]:
        """Median actor calls per run, by method."""
        seen: dict[str, list[int]] = {}
        for (s, m, p), rs in by.items():
            if s != system or p != phase or (mode is not None and m != mode):
                continue
            for r in rs:
                for k, v in (r.get(key) or {}).items() if r.get("ok") else ():
                    seen.setdefault(k, []).append(v)
        return {k: statistics.median(v) for k, v in seen.items()}

    failed = {(r["system"], r["mode"], r["phase"]) for r in runs if not r.get("ok")}
    rows: list[dict[str, Any]] = []

    def add(
        label: str,
        secs: dict[int, float],
        peer: dict[int, float] | None,
        broken: bool,
        kind: str,
        actor_calls: dict[str, float],
    ) -> None:
        s = median(list(secs.values()))
        ratios = (
            [n / secs[k] / (n / peer[k]) for k in secs if k in peer and secs[k] and peer[k]]
            if peer
            else []
        )
        rates = sorted(n / v for v in secs.values() if v)
        rows.append(
            {
                "scenario": label,
                "kind": kind,
                "messages": n,
                "seconds": s,
                "msgs_per_s": n / s if s else None,
                "mb_per_s": n * size / s / 1e6 if s else None,
                "msgs_per_s_range": [rates[0], rates[-1]] if rates else None,
                "ratio_vs_bare_actor": median(ratios),
                "ratio_range": [min(ratios), max(ratios)] if ratios else None,
                "failed": broken or s is None,
                "actor_calls": actor_calls,
            }
        )

    systems = sorted({r["system"] for r in runs}, key=["raybus", "actor", "rayqueue"].index)
    send_label = {
        "raybus": "A  raybus send only (send_messages(list))",
        "actor": "B  bare actor send only (put per batch)",
        "rayqueue": "C  ray.util.queue send only (put_nowait_batch)",
    }
    actor_send = series("actor", None, "split", "send_s")
    for system in systems:
        add(
            send_label[system],
            series(system, None, "split", "send_s"),
            actor_send if system == "raybus" else None,
            any(k[0] == system and k[2] == "split" for k in failed),
            "send",
            calls(system, None, "split", "send_calls"),
        )
    for phase, key, suffix in (
        ("e2e", "e2e_s", "end to end"),
        ("split", "recv_s", "receive+settle only"),
    ):
        for system, mode in UNITS:
            if system not in systems:
                continue
            peer = None
            if system == "raybus":
                ps, pm = PEER[mode]
                peer = series(ps, pm, phase, key)
            add(
                f"{LABELS[(system, mode)]}: {suffix}",
                series(system, mode, phase, key),
                peer,
                (system, mode, phase) in failed,
                phase,
                calls(system, mode, phase, "receive_calls"),
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "FAILED" if x is None else format(x, fmt)

    def ratio(r: dict[str, Any]) -> str:
        text = "" if r["ratio_vs_bare_actor"] is None else f"{r['ratio_vs_bare_actor']:.2f}"
        if r["failed"] and r["seconds"] is not None:
            text += " (some rounds FAILED)"
        return text

    out = md_table(
        "scenario | messages | seconds | msgs/s | MB/s | raybus ÷ bare actor "
        "| actor calls (median)",
        "---|---:|---:|---:|---:|---:|---",
        [
            (
                r["scenario"],
                r["messages"],
                f(r["seconds"], ".3f"),
                f(r["msgs_per_s"], ",.0f"),
                f(r["mb_per_s"], ".1f"),
                ratio(r),
                ", ".join(f"{k} {v:g}" for k, v in r["actor_calls"].items()),
            )
            for r in rows
        ],
    )
    return "\n".join(out)


def settlement_notes(runs: list[dict[str, Any]], n: int) -> list[str]:
    """What the design promises for A1: one-by-one completion costs about what batched
    completion costs, because settlements are coalesced instead of paying a round trip each."""
    notes = []
    for phase, key in (("split", "recv_s"), ("e2e", "e2e_s")):
        each = {
            r["round"]: r
            for r in runs
            if r.get("ok")
            and r["mode"] == "each"
            and r["system"] == "raybus"
            and r["phase"] == phase
        }
        batch = {
            r["round"]: r
            for r in runs
            if r.get("ok")
            and r["mode"] == "batch"
            and r["system"] == "raybus"
            and r["phase"] == phase
        }
        ratios = [batch[k][key] / each[k][key] for k in each if k in batch and each[k][key]]
        settles = [r["receive_calls"].get("settle") for r in each.values()]
        settles = [x for x in settles if x is not None]
        if not ratios:
            continue
        what = "receive+settle only" if phase == "split" else "end to end"
        line = (
            f"A1 ÷ A2 msgs/s ({what}): {statistics.median(ratios):.2f}"
            f" (complete_message one by one vs complete_messages)"
        )
        if settles:
            per_msg = statistics.median(settles) / n
            line += (
                f"; A1 made {statistics.median(settles):g} settle calls for {n} messages"
                f" ({per_msg:.3f} per message)"
            )
            if per_msg > 0.5:
                line += " -- PROBLEM: close to a round trip per message"
        notes.append(line)
    return notes
