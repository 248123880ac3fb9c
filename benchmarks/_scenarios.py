"""The suite's scenarios (from Service Bus's performance guide, /work/shared/seeds/002: the
high-throughput queue, many senders, many competing receivers, topics with many
subscriptions, the low-latency queue) and the plan of cells a run measures. Pure: no Ray.

A *cell* is one (scenario, body size, call style) measured for several systems back to back,
so the systems compared in a ratio ran under the same machine load.
"""

from __future__ import annotations

from typing import Any

SIZES = (100, 1024, 65536)
BATCH = 100

# Which systems run where. Topics have no express option in raybus (nor RabbitMQ's
# auto-ack/bare-actor no-ack variants: the other scenarios compare settled delivery).
_QUEUE_ALL = [
    "raybus",
    "raybus-express",
    "raybus-rd",
    "raybus-express-rd",
    "rabbitmq",
    "rabbitmq-rd",
    "actor",
    "actor-rd",
    "rayqueue",
]
_CORE = ["raybus", "raybus-express", "rabbitmq", "actor", "rayqueue"]
_TOPIC = ["raybus", "rabbitmq", "actor", "rayqueue"]

# senders/receivers: asyncio tasks in the sender and receiver worker processes; prefetch as the
# guide recommends (high for few receivers, ~10 for many competing ones).
SCENARIOS: dict[str, dict[str, Any]] = {
    "throughput": {
        "title": "High-throughput queue: 1 sender, 1 receiver, prefetch 200",
        "topology": {"kind": "queue"},
        "senders": 1,
        "receivers": 1,
        "prefetch": 200,
        "systems": _QUEUE_ALL,
    },
    "senders32": {
        "title": "Many senders: 32 concurrent asyncio senders, 1 receiver",
        "topology": {"kind": "queue"},
        "senders": 32,
        "receivers": 1,
        "prefetch": 200,
        "systems": _CORE,
    },
    "senders100": {
        "title": "100 concurrent asyncio senders, per-message calls, 1 receiver",
        "topology": {"kind": "queue"},
        "senders": 100,
        "receivers": 1,
        "prefetch": 200,
        "systems": ["raybus", "rabbitmq", "actor", "rayqueue"],
        "calls": ["single"],
    },
    "receivers8": {
        "title": "Many receivers: 1 sender, 8 competing receivers, prefetch 10",
        "topology": {"kind": "queue"},
        "senders": 1,
        "receivers": 8,
        "prefetch": 10,
        "systems": _CORE,
    },
    "topic10": {
        "title": "Topic with 10 subscriptions (1 receiver each), 1 sender",
        "topology": {"kind": "topic", "subscriptions": 10},
        "senders": 1,
        "receivers": 10,
        "prefetch": 200,
        "systems": _TOPIC,
        "calls": ["batch"],
    },
    "topic100": {
        "title": "Topic with 100 subscriptions (1 receiver each), 1 sender",
        "topology": {"kind": "topic", "subscriptions": 100},
        "senders": 1,
        "receivers": 100,
        "prefetch": 20,
        # ray.util.queue would be 100 queue actors (100 Ray worker processes) on top of
        # raybus's 100: too heavy for this machine, reported as not run.
        "systems": ["raybus", "rabbitmq", "actor"],
        "calls": ["batch"],
        # Creating 100 subscriptions (100 Ray worker processes) takes minutes here: not
        # started unless this much of the time budget is left.
        "reserve_s": 300,
    },
    "latency": {
        "title": "Low latency: 1,000 msg/s fixed rate, per-message sends, 1 receiver, prefetch 20",
        "topology": {"kind": "queue"},
        "senders": 1,
        "receivers": 1,
        "prefetch": 20,
        "systems": ["raybus", "raybus-express", "rabbitmq", "actor", "rayqueue"],
        "calls": ["single"],
        "rate": 1000,
    },
}

# Messages per cell. Batched cells are capped by bytes so 64 KiB cells stay short; a topic's n
# is per subscription.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {
        "scenarios": ["throughput", "latency", "senders100", "receivers8", "topic10"],
        "sizes": {"throughput": [1024, 65536]},
        "calls": {"receivers8": ["batch"]},
        "batch_only_sizes": [65536],
        "default_sizes": [1024],
        "throughput_systems": ["raybus", "raybus-express", "rabbitmq", "actor", "rayqueue"],
        # Cells long enough that one hiccup does not decide them (each system's): with 2,000
        # batched, 1,500 per-message-sender and 150 single messages, raybus's cells lasted
        # 0.04-0.23 s, and a 1 KiB single cell read 0.69x RabbitMQ in one quick run, 1.11x
        # and 1.09x in the two right after. The batched and many-sender cells now move what
        # the full profile's do; the run takes about 1.5 minutes instead of one.
        "batch_n": 10000,
        "single_n": 500,
        "many_n": 4000,
        "bytes_cap": 160 << 20,
        # A topic10 cell of 1,000 copies per subscription lasted 0.35-0.9 s for every system
        # (mostly start-up): single quick rounds read raybus at 0.85-1.20x of RabbitMQ. Cells of
        # 4,000 last about 2 s.
        "topic_n": {"topic10": 4000, "topic100": 100},
        "latency_s": 1.5,
        "rounds": 1,
        "timeout": 40.0,
        "budget_s": 150.0,
        # Cells that feed a target first: on a loaded machine the budget cuts the others.
        "single_last": True,
    },
    "full": {
        "scenarios": [s for s in SCENARIOS if s != "topic100"] + ["topic100"],
        "sizes": {"throughput": list(SIZES)},
        "calls": {},
        "batch_only_sizes": [],
        "default_sizes": [1024],
        "throughput_systems": _QUEUE_ALL,
        "batch_n": 10000,
        "single_n": 1500,
        "many_n": 4000,
        "bytes_cap": 160 << 20,
        "topic_n": {"topic10": 6000, "topic100": 300},
        "latency_s": 5.0,
        "rounds": 1,
        "timeout": 90.0,
        "budget_s": 1020.0,
        "single_last": False,
    },
}


def messages(profile: dict[str, Any], scenario: str, size: int, calls: str) -> int:
    sc = SCENARIOS[scenario]
    if sc.get("rate"):
        return int(sc["rate"] * profile["latency_s"])
    if scenario in profile["topic_n"]:
        n = profile["topic_n"][scenario]
    elif sc["senders"] > 1 and calls == "single":
        n = profile["many_n"]
    else:
        n = profile["batch_n"] if calls == "batch" else profile["single_n"]
    return max(100, min(n, profile["bytes_cap"] // size))


def build_plan(
    profile_name: str,
    scenarios: list[str] | None = None,
    sizes: list[int] | None = None,
    exclude: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """The cells of a run, in run order. ``scenarios``/``sizes`` replace the profile's choice;
    systems in ``exclude`` are left out (a peer that could not be started)."""
    profile = PROFILES[profile_name]
    unknown = [s for s in scenarios or [] if s not in SCENARIOS]
    if unknown:
        raise ValueError(
            f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}"
        )
    bad = [z for z in sizes or [] if z < 64]
    if bad:
        raise ValueError(f"body sizes must be >= 64 bytes (index and send time), not {bad}")
    cells = []
    for name in scenarios or profile["scenarios"]:
        sc = SCENARIOS[name]
        systems = sc["systems"]
        if name == "throughput":
            systems = [s for s in systems if s in profile["throughput_systems"]]
        for size in sizes or profile["sizes"].get(name, profile["default_sizes"]):
            for calls in profile["calls"].get(name, sc.get("calls", ["batch", "single"])):
                if calls == "single" and size in profile["batch_only_sizes"] and not sizes:
                    continue
                cells.append(
                    {
                        "scenario": name,
                        "size": size,
                        "calls": calls,
                        "n": messages(profile, name, size, calls),
                        "systems": [s for s in systems if s not in exclude],
                        "skipped": {s: "peer unavailable" for s in systems if s in exclude},
                        "topology": sc["topology"],
                        "senders": sc["senders"],
                        "receivers": sc["receivers"],
                        "prefetch": sc["prefetch"],
                        "rate": sc.get("rate"),
                        "reserve_s": sc.get("reserve_s", 0),
                    }
                )
    if profile["single_last"]:  # stable: otherwise in scenario order
        cells.sort(key=lambda c: c["calls"] == "single" and not (c["rate"] or c["senders"] > 32))
    return cells
