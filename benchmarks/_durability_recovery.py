"""Phase 3 of ``durability.py``: recovery (fill a durable queue, kill its partition actor,
time until it answers with every message again, with a breakdown of the replay) and
compaction (the bytes on disk before and after draining a queue, and the drained queue's
restart time).

``RecoveryPhases`` is mixed into ``durability.Bench``, whose helpers it uses (``namespace``,
``create_queue``, ``fill``, ``drain``, ``partition``, ``counters``, ``flushed``, ``active``).
Imported by ``durability.py`` as ``_durability_recovery``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from typing import Any

import ray
from _common import (
    BenchError,
    actor_pids,
    body_ok,
    median,
    py_spy_dump,
)
from _durability_report import log_run

import raybus
import raybus.aio
from raybus.exceptions import ServiceBusError


def disk_usage(path: str) -> dict[str, int]:
    """Bytes (file sizes and allocated blocks) and file count below ``path``."""
    apparent = allocated = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:  # deleted meanwhile (a checkpoint's clean-up)
                continue
            apparent += st.st_size
            allocated += getattr(st, "st_blocks", 0) * 512
            files += 1
    return {"bytes": apparent, "allocated_bytes": allocated, "files": files}


class RecoveryPhases:
    # -- phase 3: recovery and compaction -------------------------------------------------

    def wait_recovered(
        self, ns: str, queue: str, n: int, t_kill: float, timeout: float, spy: bool
    ) -> dict[str, Any]:
        """Until the queue answers ``n`` active messages: a new poll every 0.2 s.

        Polls overlap: while the actor restarts, a call fails only after about 2 s, so waiting
        for each answer before the next poll would measure in 2 s steps.
        """
        return asyncio.run(self._poll(ns, queue, n, t_kill, timeout, spy))

    async def _poll(
        self, ns: str, queue: str, n: int, t_kill: float, timeout: float, spy: bool
    ) -> dict[str, Any]:
        admin = raybus.aio.ServiceBusAdministrationClient(ns, storage_path=self.storage)
        done = asyncio.Event()
        out: dict[str, Any] = {"polls": 0, "poll_errors": 0}
        answers: list[int] = []
        error_samples: list[str] = []
        dumps: list[dict[str, Any]] = []

        async def poll() -> None:
            try:
                props = await admin.get_queue_runtime_properties(queue)
            except ServiceBusError as exc:
                out["poll_errors"] += 1
                if len(error_samples) < 3:  # what a client sees while the actor restarts
                    error_samples.append(
                        f"{time.perf_counter() - t_kill:.2f} s: {type(exc).__name__}"
                        f" (retryable={getattr(exc, 'retryable', None)}): {exc}"
                    )
                return
            at = time.perf_counter() - t_kill
            out.setdefault("first_answer_s", at)
            got = props.active_message_count
            if not answers or answers[-1] != got:
                answers.append(got)
            if got == n and "recovery_s" not in out:
                out["recovery_s"] = at
                done.set()

        async def spy_loop() -> None:
            await asyncio.sleep(2.0)
            while len(dumps) < 6:
                for pid, cmd in actor_pids():
                    if "PartitionActor" in cmd:
                        dump = await asyncio.to_thread(py_spy_dump, pid)
                        dumps.append(
                            {"at_s": time.perf_counter() - t_kill, "pid": pid, "dump": dump}
                        )
                await asyncio.sleep(3.0)

        tasks: set[asyncio.Task[None]] = set()
        spy_task = asyncio.ensure_future(spy_loop()) if spy else None
        deadline = time.monotonic() + timeout
        # raybus logs every failed poll at ERROR; they are counted and sampled instead.
        rpc_log = logging.getLogger("raybus.rpc")
        rpc_level = rpc_log.level
        rpc_log.setLevel(logging.CRITICAL)
        try:
            while not done.is_set():
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"queue {queue} did not answer {n} active messages within {timeout:g} s"
                        f" (answers {answers[-5:]}, errors {error_samples})"
                    )
                if len(tasks) < 50:
                    out["polls"] += 1
                    task = asyncio.ensure_future(poll())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.2)
        finally:
            for task in [*tasks, *([spy_task] if spy_task else [])]:
                task.cancel()
            await asyncio.gather(*tasks, *([spy_task] if spy_task else []), return_exceptions=True)
            rpc_log.setLevel(rpc_level)
        out.update(counts_seen=answers[-5:], poll_error_samples=error_samples, py_spy=dumps)
        return out

    def kill_and_recover(
        self,
        ns: str,
        client: raybus.ServiceBusClient,
        queue: str,
        n: int,
        spy: bool = False,
    ) -> dict[str, Any]:
        actor = self.partition(client, queue)
        t0 = time.perf_counter()
        ray.kill(actor, no_restart=False)
        out = self.wait_recovered(ns, queue, n, t0, self.args.timeout_recovery, spy)
        # The restarted actor answers again; its counters start from zero.
        flushes, _entries, _ = self.counters(self.partition(client, queue))
        out["flushes_after_restart"] = flushes
        return out

    def replay_breakdown(
        self, ns: str, client: raybus.ServiceBusClient, queue: str, n: int
    ) -> dict[str, Any]:
        """Where recovery's time goes: the partition actor's recovery steps (``Committer``'s
        ``_recover``) timed one by one in this process, on the queue's log, after its actor
        was killed for good (so nothing else uses the directory). Uses raybus internals.

        Timed twice: as the actor runs them, and with Python's cyclic garbage collector
        disabled (it traverses every object allocated so far, again and again, while a
        million records are created)."""
        from raybus._core.registry import partition_storage_dirs

        route = ray.get(client._aio._conn.registry.route.remote(queue), timeout=60)
        ray.kill(route.partitions[0], no_restart=True)
        dirs = partition_storage_dirs(ns, route.properties.name, route.incarnation, 0)
        out = self._timed_recovery(route.properties, dirs, n)
        gc.collect()
        gc.disable()
        try:
            out["gc_disabled"] = self._timed_recovery(route.properties, dirs, n)
        finally:
            gc.enable()
            gc.collect()
        return out

    def _timed_recovery(self, properties: Any, dirs: tuple[str, ...], n: int) -> dict[str, Any]:
        from raybus._clock import SystemClock
        from raybus._core import journal
        from raybus._core.partition import Partition
        from raybus._storage import DurableLog

        t0 = time.perf_counter()
        log = DurableLog.from_storage_path(self.storage, *dirs)
        found = log.recover()
        t1 = time.perf_counter()
        state = journal.ReplayedState()
        convert = replay = 0.0
        tables = ([found.checkpoint] if found.checkpoint is not None else []) + [
            t for _lsn, t in found.entries
        ]
        del found
        for table in tables:
            a = time.perf_counter()
            entries = journal.from_table(table)
            b = time.perf_counter()
            journal.replay(entries, state)
            convert += b - a
            replay += time.perf_counter() - b
        t2 = time.perf_counter()
        core = Partition(properties, SystemClock(), 0)
        core.load(state)
        core.enable_journal()
        t3 = time.perf_counter()
        if core.message_count() != n:
            raise BenchError(f"offline replay found {core.message_count()} messages, not {n}")
        return {
            "files": len(tables),
            "read_decode_s": t1 - t0,
            "from_table_s": convert,
            "replay_s": replay,
            "load_s": t3 - t2,
            "total_s": t3 - t0,
        }

    def check_peek(self, client: raybus.ServiceBusClient, queue: str, n: int) -> None:
        """The first messages come back in order, with their bodies."""
        receiver = client.get_queue_receiver(queue)
        try:
            msgs = receiver.peek_messages(max_message_count=min(n, 10))
        finally:
            receiver.close()
        ids = [int(m.message_id or -1) for m in msgs]
        if ids != list(range(len(ids))) or not ids:
            raise BenchError(f"peek after recovery returned ids {ids}, expected 0..{len(ids) - 1}")
        if not all(body_ok(int(m.message_id or -1), m.body, self.size) for m in msgs):
            raise BenchError("peek after recovery: a body came back damaged")

    def phase_recovery(self) -> dict[str, Any]:
        args = self.args
        n = args.messages
        ns, client, admin = self.namespace("recovery", "durable")
        q = "recovery"
        nsdir = os.path.join(self.storage, ns)
        out: dict[str, Any] = {"messages": n}
        try:
            with self.watchdog.armed(
                args.timeout_fill + args.recoveries * args.timeout_recovery + 300,
                "recovery phase",
            ):
                self.create_queue(admin, q, "durable")
                actor = self.partition(client, q)
                out["fill_s"] = self.fill(client, q, n, "recovery fill")
                out["fill_msgs_per_s"] = n / out["fill_s"]
                if (got := self.active(admin, q)) != n:
                    raise BenchError(f"queue holds {got} after filling {n}")
                flushes, entries, _ = self.counters(actor)
                out["fill_flushed_entries"] = entries
                out["fill_flushes"] = flushes
                out["disk"] = disk_usage(nsdir)
                kills = []
                for k in range(args.recoveries):
                    kills.append(self.kill_and_recover(ns, client, q, n, spy=args.spy))
                    log_run(
                        {"kill": k, **{key: v for key, v in kills[-1].items() if key != "py_spy"}}
                    )
                    self.check_peek(client, q, n)
                out["kills"] = kills
                out["recovery_s"] = median([r["recovery_s"] for r in kills])
                out["recovery_s_all"] = [r["recovery_s"] for r in kills]
                out["first_answer_s"] = median([r["first_answer_s"] for r in kills])
                if args.breakdown:
                    try:
                        out["breakdown"] = self.replay_breakdown(ns, client, q, n)
                        log_run({"breakdown": out["breakdown"]})
                    except Exception as exc:  # internals may change: a diagnostic only
                        out["breakdown_error"] = f"{type(exc).__name__}: {exc}"
                out["ok"] = True
        except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception), self.watchdog.armed(120, "deleting the queue"):
                admin.delete_queue(q)  # frees the actor's memory and the disk
        log_run({"phase": "recovery", **{k: v for k, v in out.items() if k != "kills"}})
        return out

    def phase_compaction(self) -> dict[str, Any]:
        args = self.args
        n = args.drain_messages
        ns, client, admin = self.namespace("compaction", "durable")
        q = "compaction"
        nsdir = os.path.join(self.storage, ns)
        out: dict[str, Any] = {"messages": n}
        peak = {"bytes": 0, "files": 0}

        def sample() -> None:
            d = disk_usage(nsdir)
            peak["bytes"] = max(peak["bytes"], d["bytes"])
            peak["files"] = max(peak["files"], d["files"])

        try:
            with self.watchdog.armed(
                2 * args.timeout_fill + args.timeout_recovery + 300, "compaction"
            ):
                self.create_queue(admin, q, "durable")
                actor = self.partition(client, q)
                out["disk_empty_queue"] = disk_usage(nsdir)
                out["fill_s"] = self.fill(client, q, n, "compaction fill")
                out["disk_full"] = disk_usage(nsdir)
                sample()
                out["drain_s"] = self.drain(client, q, n, "compaction drain", sample)
                out["drain_msgs_per_s"] = n / out["drain_s"]
                # A checkpoint runs after the flush that made it due: let it finish.
                t0 = time.perf_counter()
                self.flushed(actor)
                stable = disk_usage(nsdir)
                while time.perf_counter() - t0 < 5:
                    time.sleep(0.25)
                    now = disk_usage(nsdir)
                    if now == stable:
                        break
                    stable = now
                out["disk_drained"] = stable
                out["disk_peak_during_drain"] = peak
                if (left := self.active(admin, q)) != 0:
                    raise BenchError(f"{left} messages left after draining")
                checkpoint_lsn = ray.get(
                    actor.__ray_call__.remote(lambda self: self._commit.durable_log.checkpoint_lsn),
                    timeout=30,
                )
                out["checkpoint_lsn"] = checkpoint_lsn
                restart = self.kill_and_recover(ns, client, q, 0)
                out["restart_drained_s"] = restart["recovery_s"]
                out["ok"] = True
        except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception), self.watchdog.armed(120, "deleting the queue"):
                admin.delete_queue(q)
        log_run({"phase": "compaction", **out})
        return out
