"""``raybus stats``: a live table of the namespace's queues and subscriptions, with in/out rates.

A subscription is stored like a queue, so it is sampled the same way and shown by its path
``TOPIC/Subscriptions/SUB`` (its in rate counts the copies it received). Without arguments every
queue and every subscription of every topic is shown; a topic name as an argument stands for
its subscriptions.

Counts come from ``get_queue_runtime_properties``' source (the registry asks every partition);
the running total of accepted messages per partition (the partition actors' ``stats``) turns
successive samples into rates (``_sampling.rates``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .. import _rpc
from .._sync import run
from ..exceptions import MessagingEntityNotFoundError, ServiceBusError
from . import _context
from ._parse import parse_duration
from ._render import json_line
from ._sampling import QueueSample, Rates, rates

__all__ = ["stats"]


async def _sample_queue(conn: Any, name: str) -> QueueSample | None:
    try:
        route, counts = await _rpc.call(
            name, conn.registry_for(name).counts, name, retries=_rpc.READ_RETRIES
        )
    except MessagingEntityNotFoundError:
        return None  # deleted since it was listed
    at = time.monotonic()
    sent: float | None
    try:
        totals = await asyncio.gather(
            *(_rpc.call(name, h.stats, retries=_rpc.READ_RETRIES) for _pid, h in route.existing())
        )
        sent = float(sum(t.get("sent", 0) for t in totals))
    except ServiceBusError:
        sent = None  # a partition restarting: no rate this time
    props = route.properties
    return QueueSample(
        name=props.name,
        at=at,
        active=sum(c.active for c in counts),
        dead_letter=sum(c.dead_letter for c in counts),
        scheduled=sum(c.scheduled for c in counts),
        partitions=len(route.pmap.live),
        size_in_bytes=sum(c.size_in_bytes for c in counts),
        status=props.status.value,
        sent=sent,
    )


def sample(ctx: _context.CliContext, only: list[str] | None = None) -> list[QueueSample]:
    """One sample of every queue and subscription of the namespace (or of ``only``: queue
    names, subscription paths, topic names for all their subscriptions), sorted by name."""
    aadmin = ctx.admin()._aio
    conn = aadmin._conn

    async def subscriptions(topic: str) -> list[str]:
        try:
            return [s.path for s in await aadmin.list_subscriptions(topic)]
        except MessagingEntityNotFoundError:
            return []  # deleted since it was listed

    async def go() -> list[QueueSample]:
        topics = {t.name.lower(): t.name for t in await aadmin.list_topics()}
        names: list[str] = []
        if only:
            for name in only:
                topic = topics.get(name.lower())
                names.extend([name] if topic is None else await subscriptions(topic))
        else:
            routes = await _rpc.call(None, conn.registry.list_queues, retries=_rpc.READ_RETRIES)
            names = [r.properties.name for r in routes]
            for paths in await asyncio.gather(*(subscriptions(t) for t in topics.values())):
                names.extend(paths)
        found = await asyncio.gather(*(_sample_queue(conn, n) for n in names))
        return sorted((s for s in found if s is not None), key=lambda s: s.name.lower())

    return run(go())


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def table(namespace: str, samples: list[QueueSample], previous: dict[str, QueueSample]) -> Table:
    t = Table(
        title=f"raybus namespace {namespace}",
        title_justify="left",
        caption="parts: partitions; dlq: dead-letter; sched: scheduled; rates in messages/s",
        caption_justify="left",
    )
    # Subscription paths are long: the name column wraps so the numbers keep their width.
    t.add_column("entity", overflow="fold", min_width=10)
    t.add_column("status", no_wrap=True)
    # Short headers: the table fits 80 columns (what rich assumes when not on a terminal).
    for col in ("parts", "active", "dlq", "sched", "size", "in/s", "out/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in samples:
        r = rates(previous.get(s.name), s)
        t.add_row(
            s.name,
            s.status,
            str(s.partitions),
            f"{s.active:,}",
            f"{s.dead_letter:,}",
            f"{s.scheduled:,}",
            _size(s.size_in_bytes),
            _rate(r.incoming),
            _rate(r.outgoing),
        )
    if not samples:
        t.caption = "no queues or subscriptions"
    return t


def _json(s: QueueSample, r: Rates) -> str:
    return json_line(
        {
            "name": s.name,
            "status": s.status,
            "partitions": s.partitions,
            "active": s.active,
            "dead_letter": s.dead_letter,
            "scheduled": s.scheduled,
            "size_in_bytes": s.size_in_bytes,
            "in_per_s": r.incoming,
            "out_per_s": r.outgoing,
        }
    )


def stats(
    ctx: typer.Context,
    queues: Annotated[
        list[str] | None,
        typer.Argument(
            help="Only these queues, subscriptions (TOPIC/Subscriptions/SUB) or topics (all "
            "their subscriptions); default: all.",
            show_default=False,
            metavar="[ENTITY]...",
        ),
    ] = None,
    interval: Annotated[
        str, typer.Option("--interval", "-i", help="Time between samples (e.g. 2, 500ms).")
    ] = "2",
    once: Annotated[
        bool,
        typer.Option("--once", help="Take two samples --interval apart, print one table and exit."),
    ] = False,
    samples: Annotated[
        int | None,
        typer.Option("--samples", min=1, help="Stop after this many refreshes (default: Ctrl-C)."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="With --once: one JSON line per queue or subscription."),
    ] = False,
) -> None:
    """Live table of queues and subscriptions: counts, partitions, in/out rates.

    Shows active, dead-letter and scheduled counts, partitions, and in/out rates (messages
    per second between successive samples), refreshed every --interval until Ctrl-C.
    """
    try:
        interval_s = parse_duration(interval).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--interval") from None
    if interval_s <= 0:
        raise typer.BadParameter("must be positive", param_hint="--interval")
    if as_json and not once:
        raise typer.BadParameter("--json needs --once", param_hint="--json")
    cli = _context.get(ctx)
    previous = {s.name: s for s in sample(cli, queues)}
    if once:
        time.sleep(interval_s)
        current = sample(cli, queues)
        if as_json:
            for s in current:
                typer.echo(_json(s, rates(previous.get(s.name), s)))
        else:
            Console().print(table(cli.namespace, current, previous))
        return
    console = Console()
    shown = 0
    try:
        with Live(
            table(cli.namespace, list(previous.values()), {}),
            console=console,
            refresh_per_second=4,
        ) as live:
            while samples is None or shown < samples:
                time.sleep(interval_s)
                current = sample(cli, queues)
                live.update(table(cli.namespace, current, previous))
                previous = {s.name: s for s in current}
                shown += 1
    except KeyboardInterrupt:
        pass
