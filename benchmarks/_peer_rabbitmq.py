"""RabbitMQ quorum queues as a system of the suite (pika; the node is started by
``benchmarks/rabbitmq.sh`` on 127.0.0.1).

* Queue: durable, ``x-queue-type=quorum`` (a single-node Raft group: a confirm waits for the
  broker's fsync), persistent messages. Topic of K subscriptions: a durable fanout exchange
  bound to K quorum queues.
* Sender: publisher confirms. pika's ``BlockingChannel.confirm_delivery`` waits for a confirm
  after *every* publish; to confirm per batch, as the other systems acknowledge per call, the
  sender publishes through the channel's asynchronous half on the same blocking connection
  and pumps I/O with the connection's own wait loop (``_flush_output``, a private pika
  method) until every publish of the call is confirmed. calls="single": one publish, one
  confirm. Calls made concurrently on one endpoint while it waits go out together next.
* Receiver: ``basic_qos(prefetch_count)``; peek-lock's peer is manual acks (batch: one
  ``basic_ack(multiple=True)`` per received list; single: one ack per message);
  receive-and-delete's peer is ``auto_ack=True``.

pika connections are not thread-safe and block, so each endpoint owns a connection and one
thread of its own; the worker's asyncio tasks wait on that thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import uuid
from typing import Any

from _common import BenchError

HOST, PORT = "127.0.0.1", int(os.environ.get("RAYBUS_RMQ_PORT", "5672"))
_names = itertools.count(1)
_prefix = f"raybus-suite-{uuid.uuid4().hex[:6]}"


def _connect() -> Any:
    import pika

    params = pika.ConnectionParameters(
        host=HOST, port=PORT, heartbeat=0, blocked_connection_timeout=120
    )
    return pika.BlockingConnection(params)


class Admin:
    def __init__(self) -> None:
        self.conn = _connect()
        self.ch = self.conn.channel()

    def setup(self, topology: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        base = f"{_prefix}-{next(_names)}"
        k = topology.get("subscriptions", 0)
        queues = [base] if topology["kind"] == "queue" else [f"{base}-s{j}" for j in range(k)]
        for q in queues:
            self.ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
        exchange = ""
        if topology["kind"] == "topic":
            exchange = base
            self.ch.exchange_declare(exchange, exchange_type="fanout", durable=True)
            for q in queues:
                self.ch.queue_bind(q, exchange)
        return {
            "queues": queues,
            "exchange": exchange,
            "routing_key": queues[0] if not exchange else "",
        }

    def check_empty(self, target: dict[str, Any]) -> None:
        left = sum(
            self.ch.queue_declare(q, passive=True).method.message_count for q in target["queues"]
        )
        if left:
            raise BenchError(f"RabbitMQ: {left} messages left (unacknowledged or not received)")

    def teardown(self, target: dict[str, Any]) -> None:
        for q in target["queues"]:
            self.ch.queue_delete(q)
        if target["exchange"]:
            self.ch.exchange_delete(target["exchange"])

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


class _Threaded:
    """Runs every pika call of one endpoint on the endpoint's own thread."""

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)


class Sender(_Threaded):
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        super().__init__()
        self.target = target
        self.single = cfg["calls"] == "single"
        self.conn: Any = None
        self.pending: list[tuple[list[bytes], asyncio.Future[None]]] = []
        self.flushing = False
        self.flusher: asyncio.Future[None] | None = None

    def _open(self) -> None:
        import pika

        self.conn = _connect()
        self.ch = self.conn.channel()
        self.impl = self.ch._impl
        self.unconfirmed: set[int] = set()
        self.nacked = 0
        self.tag = 0
        ready: list[bool] = []

        def on_confirm(frame: Any) -> None:
            m = frame.method
            if m.multiple:
                done = {t for t in self.unconfirmed if t <= m.delivery_tag}
            else:
                done = {m.delivery_tag}
            self.unconfirmed.difference_update(done)
            if isinstance(m, pika.spec.Basic.Nack):
                self.nacked += len(done)

        self.impl.confirm_delivery(
            ack_nack_callback=on_confirm, callback=lambda _f: ready.append(True)
        )
        self.conn._flush_output(lambda: bool(ready))
        self.props = pika.BasicProperties(delivery_mode=2)

    def _publish(self, bodies: list[bytes]) -> None:
        if self.conn is None:
            self._open()
        for b in bodies:
            self.tag += 1
            self.unconfirmed.add(self.tag)
            self.impl.basic_publish(
                exchange=self.target["exchange"],
                routing_key=self.target["routing_key"],
                body=b,
                properties=self.props,
            )
        # The connection's wait loop: block on I/O until the call's publishes are confirmed.
        self.conn._flush_output(lambda: not self.unconfirmed)
        if self.nacked:
            raise BenchError(f"RabbitMQ nacked {self.nacked} publishes")

    async def send(self, bodies: list[bytes]) -> None:
        for call in [[b] for b in bodies] if self.single else [bodies]:
            fut = asyncio.get_running_loop().create_future()
            self.pending.append((call, fut))
            if not self.flushing:
                self.flushing = True
                self.flusher = asyncio.ensure_future(self._flush())
            await fut

    async def _flush(self) -> None:
        """Calls made while a publish is waiting for its confirms go out together next, each
        answered once all of its messages are confirmed: what an asynchronous AMQP client
        does (raybus's sender merges concurrent calls likewise), so that concurrent calls on
        one endpoint (the open-loop latency sender) are not serialised behind one confirm
        each."""
        try:
            while self.pending:
                calls, self.pending = self.pending, []
                try:
                    await self.run(self._publish, [b for bodies, _f in calls for b in bodies])
                except Exception as exc:
                    for _b, f in calls:
                        f.set_exception(exc)
                else:
                    for _b, f in calls:
                        f.set_result(None)
        finally:
            self.flushing = False

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        raise NotImplementedError

    async def settle(self, tokens: list[Any]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        def _close() -> None:
            if self.conn is not None:
                self.conn.close()

        try:
            await self.run(_close)
        finally:
            self.shutdown()


class Receiver(_Threaded):
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        super().__init__()
        self.queue = target["queues"][source]
        self.auto_ack = system["settle"] == "delete"
        self.single = cfg["calls"] == "single"
        self.prefetch = max(1, cfg["prefetch"])
        self.conn: Any = None
        self.stopped = False

    def _open(self) -> None:
        self.conn = _connect()
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=self.prefetch)
        self.gen = self.ch.consume(self.queue, auto_ack=self.auto_ack, inactivity_timeout=0.005)

    def _receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        import time

        if self.conn is None:
            self._open()
        out: list[tuple[bytes, Any]] = []
        deadline = time.monotonic() + wait
        while len(out) < max_n:
            method, _props, body = next(self.gen)
            if method is None:  # nothing for 5 ms: return what there is
                if out or self.stopped or time.monotonic() >= deadline:
                    break
                continue
            out.append((body, method.delivery_tag))
        return out

    def _ack(self, tags: list[int]) -> None:
        if self.single:
            for t in tags:
                self.ch.basic_ack(delivery_tag=t)
        else:
            self.ch.basic_ack(delivery_tag=max(tags), multiple=True)

    async def send(self, bodies: list[bytes]) -> None:
        raise NotImplementedError

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        return await self.run(self._receive, max_n, wait)  # type: ignore[no-any-return]

    def stop(self) -> None:
        """The run is over: a receive under way on the endpoint's thread returns within 5 ms
        (the worker has stopped awaiting it), so close() need not wait out its wait."""
        self.stopped = True

    async def settle(self, tokens: list[Any]) -> None:
        if not self.auto_ack and tokens:
            await self.run(self._ack, tokens)

    async def close(self) -> None:
        def _close() -> None:
            if self.conn is not None:
                self.ch.cancel()
                # A synchronous round trip: the broker has processed the acks before close.
                self.ch.queue_declare(self.queue, passive=True)
                self.conn.close()

        try:
            await self.run(_close)
        finally:
            self.shutdown()
