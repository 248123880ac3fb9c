"""Turning a suite result into what people read: the targets of issue 7 (pass/fail), Markdown
tables with ratios (raybus ÷ peer), the chart, and benchmarks/RESULTS.md.

Everything but ``chart`` is pure (unit-tested without Ray or matplotlib).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from _peer_base import LABELS
from _stats import LATENCY_SCENARIOS, cell_key, ratios

PEERS = ["rabbitmq", "actor", "rayqueue"]
RMQ_TARGET = "≥ RabbitMQ quorum on every scenario it supports (msgs/s; latency scenario: p99)"
PEER_NAMES = {"rabbitmq": "RabbitMQ quorum", "actor": "bare actor", "rayqueue": "ray.util.queue"}
NOTES_MARKER = "<!-- hand-written notes below: kept when this file is regenerated -->"


def _get(
    summary: Sequence[Mapping[str, Any]], scenario: str, size: int, calls: str, system: str
) -> Mapping[str, Any] | None:
    for s in summary:
        if cell_key(s) == (scenario, size, calls) and s["system"] == system:
            return s
    return None


def _target(name: str, measured: str, ok: bool | None) -> dict[str, Any]:
    return {
        "name": name,
        "measured": measured,
        "status": "not measured" if ok is None else ("pass" if ok else "fail"),
    }


def evaluate_targets(summary: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The six targets of issue 7 against a run's summary. A target whose cells did not run
    (or failed) is "not measured", never a pass."""
    out = []

    def rate(*key: Any) -> float | None:
        s = _get(summary, *key)
        return None if s is None else s["msgs_per_s"]

    r = rate("throughput", 1024, "batch", "raybus")
    out.append(
        _target(
            "high-throughput 1 KiB durable peek-lock + complete ≥ 50,000 msg/s",
            "—" if r is None else f"{r:,.0f} msg/s",
            None if r is None else r >= 50_000,
        )
    )
    vs = ratios(summary, "raybus", ["rabbitmq", "actor", "rayqueue"])
    rmq = {k: v["rabbitmq"] for k, v in vs.items() if v["rabbitmq"] is not None}
    if rmq:
        worst = min(rmq, key=lambda k: rmq[k])
        below = sum(1 for v in rmq.values() if v < 1)
        measured = (
            f"{len(rmq) - below} of {len(rmq)} cells ≥ 1x; worst {rmq[worst]:.2f}x ({_cell(worst)})"
        )
        out.append(_target(RMQ_TARGET, measured, below == 0))
    else:
        out.append(_target(RMQ_TARGET, "—", None))
    q = vs.get(("senders100", 1024, "single"), {}).get("rayqueue")
    out.append(
        _target(
            "per-message calls, 100 asyncio senders + 1 receiver ≥ 10x ray.util.queue put/get",
            "—" if q is None else f"{q:.1f}x",
            None if q is None else q >= 10,
        )
    )
    act = {k: v["actor"] for k, v in vs.items() if v["actor"] is not None and k[2] == "batch"}
    if act:
        worst = min(act, key=lambda k: act[k])
        below = sum(1 for v in act.values() if v < 0.3)
        measured = (
            f"{len(act) - below} of {len(act)} batched cells ≥ 0.30x; "
            f"worst {act[worst]:.2f}x ({_cell(worst)})"
        )
        out.append(
            _target("≥ 30 % of the bare-actor ceiling with the same batches", measured, below == 0)
        )
    else:
        out.append(_target("≥ 30 % of the bare-actor ceiling with the same batches", "—", None))
    big = _get(summary, "throughput", 65536, "batch", "raybus")
    mb = None if big is None else big["mb_per_s"]
    out.append(
        _target(
            "64 KiB bodies ≥ 50 MB/s",
            "—" if mb is None else f"{mb:.1f} MB/s",
            None if mb is None else mb >= 50,
        )
    )
    lat = _get(summary, "latency", 1024, "single", "raybus")
    lm = None if lat is None else lat.get("latency")
    if lm:
        ach = lat.get("achieved_rate")  # type: ignore[union-attr]
        measured = f"p50 {lm['p50_ms']:.2f} ms, p99 {lm['p99_ms']:.2f} ms" + (
            f" at {ach:,.0f} msg/s" if ach else ""
        )
        ok: bool | None = lm["p50_ms"] <= 2 and lm["p99_ms"] <= 20
    else:
        measured, ok = "—", None
    out.append(_target("low latency at 1,000 msg/s: p50 ≤ 2 ms, p99 ≤ 20 ms", measured, ok))
    return out


def _cell(key: tuple[str, int, str]) -> str:
    return f"{key[0]}, {_size(key[1])}, {key[2]}"


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "—" if x is None else format(x, fmt)


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _rate_cell(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return "not run"
    if s.get("skipped"):
        return f"not run ({s['skipped']})"
    if s["msgs_per_s"] is None:
        return "FAILED"
    if s.get("failed_rounds"):
        ran = s["rounds"] - s["failed_rounds"]
        return f"{_num(s['msgs_per_s'])} ({ran} of {s['rounds']} rounds)"
    return _num(s["msgs_per_s"])


def ratio_table(summary: Sequence[Mapping[str, Any]], scenario_titles: Mapping[str, str]) -> str:
    """The headline table: raybus durable (peek-lock + complete) per cell, and raybus ÷ each
    peer run in the same cell (delivered msgs/s; a topic counts every copy). Fixed-rate cells
    are in ``latency_table`` instead."""
    vs = ratios(summary, "raybus", PEERS)
    lines = [
        "| scenario | size | calls | raybus msgs/s | MB/s | "
        + " | ".join(f"{PEER_NAMES[p]} msgs/s | ÷ {PEER_NAMES[p]}" for p in PEERS)
        + " |",
        "|---|---:|---|---:|---:|" + "---:|---:|" * len(PEERS),
    ]
    for key in _keys(summary):
        if key[0] in LATENCY_SCENARIOS:
            continue
        rb = _get(summary, *key, "raybus")
        row = [
            scenario_titles.get(key[0], key[0]).split(":")[0],
            _size(key[1]),
            key[2],
            _rate_cell(rb),
            _num(None if rb is None else rb["mb_per_s"], ",.1f"),
        ]
        for p in PEERS:
            row += [_rate_cell(_get(summary, *key, p)), _ratio(vs.get(key, {}).get(p))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _keys(summary: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, str]]:
    """The cells of a summary, in run order."""
    keys: list[tuple[str, int, str]] = []
    for s in summary:
        if cell_key(s) not in keys:
            keys.append(cell_key(s))
    return keys


def latency_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Fixed-rate cells: every system's achieved rate and latency percentiles, and how raybus
    durable's p99 compares (peer p99 ÷ raybus p99: above 1 means raybus's is lower)."""
    lines = [
        "| size | system | achieved msgs/s | p50 ms | p99 ms | p99.9 ms | peer p99 ÷ raybus p99 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key in _keys(summary):
        if key[0] not in LATENCY_SCENARIOS:
            continue
        vs = ratios(summary, "raybus", [s["system"] for s in summary]).get(key, {})
        for s in summary:
            if cell_key(s) != key:
                continue
            lat = s.get("latency") or {}
            ach = s.get("achieved_rate")
            cells = [_size(key[1]), LABELS.get(s["system"], s["system"])]
            if s["msgs_per_s"] is None:
                cells += [_rate_cell(s), "", "", "", ""]
            else:
                cells += [
                    _num(ach),
                    *(_num(lat.get(q), ".2f") for q in ("p50_ms", "p99_ms", "p999_ms")),
                ]
                cells.append("" if s["system"] == "raybus" else _ratio(vs.get(s["system"])))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "(not run)"


VARIANTS = [
    ("raybus", "rabbitmq"),
    ("raybus-express", "rabbitmq"),
    ("raybus-rd", "rabbitmq-rd"),
    ("raybus-express-rd", "rabbitmq-rd"),
]


def variants_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """raybus's storage and receive modes side by side, each against RabbitMQ in the same
    settle mode (peek-lock ↔ manual ack, receive-and-delete ↔ auto-ack): msgs/s and the ratio.
    Express answers before its write reaches the disk (within 1 s), a quorum queue after its
    fsync: that ratio is not like for like, and says what the durable write path costs."""
    head = " | ".join(
        f"{LABELS[v]} (÷ {'auto-ack' if p.endswith('-rd') else 'manual ack'})" for v, p in VARIANTS
    )
    lines = [f"| scenario | size | calls | {head} |", "|---|---:|---|" + "---:|" * len(VARIANTS)]
    found = False
    for key in _keys(summary):
        if key[0] in LATENCY_SCENARIOS:
            continue
        row = [key[0], _size(key[1]), key[2]]
        for ours, peer in VARIANTS:
            mine = _get(summary, *key, ours)
            theirs = _get(summary, *key, peer) or _get(summary, *key, "rabbitmq")
            if mine is None or mine.get("skipped"):
                row.append("")
                continue
            found = found or ours != "raybus"
            r = ratio_of(mine, theirs)
            row.append(f"{_rate_cell(mine)} ({_ratio(r)})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) if found else "(no variants run)"


def ratio_of(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> float | None:
    if not a or not b or a["msgs_per_s"] is None or not b["msgs_per_s"]:
        return None
    return float(a["msgs_per_s"]) / float(b["msgs_per_s"])


def detail_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """Every system of every cell, raw: msgs/s, MB/s, latency percentiles, failures."""
    lines = [
        "| scenario | size | calls | system | msgs/s | MB/s | p50 ms | p99 ms | p99.9 ms | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in summary:
        lat = s.get("latency") or {}
        note = "; ".join(_last_line(e) for e in s.get("errors") or [])
        if s.get("skipped"):
            note = f"not run: {s['skipped']}"
        if s.get("achieved_rate"):
            note = (note + "; " if note else "") + f"achieved {s['achieved_rate']:,.0f} msg/s"
        lines.append(
            "| "
            + " | ".join(
                [
                    s["scenario"],
                    _size(s["size"]),
                    s["calls"],
                    LABELS.get(s["system"], s["system"]),
                    _rate_cell(s),
                    _num(s["mb_per_s"], ",.1f"),
                    _num(lat.get("p50_ms"), ".2f"),
                    _num(lat.get("p99_ms"), ".2f"),
                    _num(lat.get("p999_ms"), ".2f"),
                    note,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def _last_line(error: str) -> str:
    """The line of an error that says what went wrong (a traceback's last), for a table cell."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    return (lines[-1] if lines else "?")[:160].replace("|", "/")


def targets_table(targets: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| target | measured | result |", "|---|---|---|"]
    for t in targets:
        mark = {"pass": "**pass**", "fail": "**FAIL**"}.get(t["status"], t["status"])
        lines.append(f"| {t['name']} | {t['measured']} | {mark} |")
    return "\n".join(lines)


def facts_block(doc: Mapping[str, Any]) -> str:
    m = doc["machine"]
    v = m.get("versions", {})
    la0 = ", ".join(f"{x:.2f}" for x in m["loadavg_start"] or [])
    la1 = ", ".join(f"{x:.2f}" for x in m["loadavg_end"] or [])
    unavailable = "; ".join(f"{k}: {r}" for k, r in doc["peers_unavailable"].items()) or "none"
    during = sorted(r["loadavg_1m"] for r in doc.get("runs", []) if "loadavg_1m" in r)
    sampled = (
        f"; 1-minute load at the start of each run: min {during[0]:.1f}, "
        f"median {during[len(during) // 2]:.1f}, max {during[-1]:.1f}"
        if during
        else ""
    )
    return "\n".join(
        [
            f"- date: {doc['started_at']} (UTC), duration {doc['duration_s']:.0f} s, "
            f"profile `{doc['settings'].get('profile')}`",
            f"- command: `{doc['settings'].get('command')}`",
            f"- CPUs: {m['cpu_count']} ({', '.join(m.get('cpu_model') or [])}), "
            f"memory {m.get('mem_gb', '?')} GB",
            f"- load average (1, 5, 15 min) at start: {la0}; at end: {la1} "
            f"(the machine is shared with other agents' work){sampled}",
            "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
            f"- git commit: {m.get('git_commit')}",
            f"- peers not available: {unavailable}",
        ]
    )


def run_section(doc: Mapping[str, Any], titles: Mapping[str, str], chart: str | None) -> str:
    parts = [facts_block(doc), "", "#### Targets (issue 7)", "", targets_table(doc["targets"]), ""]
    parts += [
        "#### raybus against its peers (raybus ÷ peer: above 1 means raybus is faster)",
        "",
        ratio_table(doc["summary"], titles),
        "",
        "#### raybus durable and express, peek-lock and receive-and-delete, against RabbitMQ",
        "",
        variants_table(doc["summary"]),
        "",
        "#### Low latency: 1,000 msg/s, open loop, per-message sends",
        "",
        latency_table(doc["summary"]),
        "",
    ]
    if chart:
        parts += [f"![msgs/s by cell]({chart})", ""]
    parts += [
        "<details><summary>Every system, every cell</summary>",
        "",
        detail_table(doc["summary"]),
        "",
        "</details>",
        "",
    ]
    return "\n".join(parts)


def results_md(
    runs: Sequence[tuple[str, Mapping[str, Any], str | None]], titles: Mapping[str, str], notes: str
) -> str:
    """benchmarks/RESULTS.md from (heading, result document, chart path) per published run,
    followed by the hand-written notes (kept across regenerations)."""
    out = [
        "# Benchmark results",
        "",
        "Generated by `benchmarks/suite.py --publish` (`make bench`: quick; `make bench-full`:",
        "full) from the JSON in `benchmarks/published/`; benchmarks/README.md says what each",
        "scenario does. Rates are delivered messages per second from the first send to the last",
        "settlement (a topic counts every copy), senders and receivers in two separate worker",
        "processes for every system. Prefer the ratios to the absolute numbers: the machine has",
        "2 cores shared with other work.",
        "",
        "Scenarios: " + "; ".join(f"**{k}**: {v}" for k, v in titles.items()) + ".",
        "",
    ]
    for heading, doc, chart in runs:
        out += [f"## {heading}", "", run_section(doc, titles, chart)]
    out += [NOTES_MARKER, notes.strip(), ""]
    return "\n".join(out)


def split_notes(text: str) -> str:
    """The hand-written part of an existing RESULTS.md ("" if it has none)."""
    return text.split(NOTES_MARKER, 1)[1] if NOTES_MARKER in text else ""


def chart(summary: Sequence[Mapping[str, Any]], path: str, title: str) -> None:
    """Left: grouped bars of delivered msgs/s (log scale) per cell for raybus and its peers.
    Right: p50 and p99 latency per system in the fixed-rate scenario (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["raybus", "raybus-express", *PEERS]
    keys = [k for k in _keys(summary) if k[0] not in LATENCY_SCENARIOS]
    lat = [
        s
        for s in summary
        if s["scenario"] in LATENCY_SCENARIOS and s.get("latency") and s["msgs_per_s"]
    ]
    fig, axes = plt.subplots(
        1, 2, figsize=(max(9, 1.1 * len(keys) + 4), 5.5), gridspec_kw={"width_ratios": [3, 1]}
    )
    ax = axes[0]
    width = 0.8 / len(systems)
    for j, system in enumerate(systems):
        vals = []
        for key in keys:
            s = _get(summary, *key, system)
            vals.append(s["msgs_per_s"] if s and s["msgs_per_s"] else 0)
        if any(vals):
            xs = [i + (j - len(systems) / 2 + 0.5) * width for i in range(len(keys))]
            ax.bar(xs, vals, width, label=LABELS.get(system, system))
    ax.set_yscale("log")
    ax.set_ylabel("delivered msgs/s (log)")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{k[0]}\n{_size(k[1])} {k[2]}" for k in keys], fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    if lat:
        names = [s["system"] for s in lat]
        xs = range(len(lat))
        ax.bar([x - 0.2 for x in xs], [s["latency"]["p50_ms"] for s in lat], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [s["latency"]["p99_ms"] for s in lat], 0.4, label="p99")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.axhline(2, color="grey", lw=0.8, ls=":")
        ax.axhline(20, color="grey", lw=0.8, ls="--")
        ax.legend(fontsize=7)
    ax.set_ylabel("send-to-receive latency, ms (log)")
    ax.set_title("1,000 msg/s open loop\n(targets: p50 2 ms, p99 20 ms)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
