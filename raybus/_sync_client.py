"""The sync API: thin blocking facades over ``raybus.aio``.

Each method runs the asyncio implementation on raybus's background event loop
(``raybus._sync``), so the logic, batching and error handling exist once. Objects of one sync
client may be used from several threads; their calls are serialised through that loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import datetime
from typing import Any

from . import _sync, aio
from ._core.filters import RuleProperties, SqlRuleAction
from ._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, SettleOp
from ._core.pool import ProcessorStatistics
from ._handler_from_connection_string import (
    ReceiverFromConnectionString,
    SenderFromConnectionString,
)
from ._paged import ItemList
from ._retry import RetryMode
from ._sync import run
from .aio import EntityInfo, _complete
from .aio._fanout import _past
from .aio._processor import DEFAULT_STOP_TIMEOUT_S, Handler, Seconds, in_thread
from .aio._receiver import lock_token_of
from .aio._sender import SendInput, _records
from .auth import CredentialLike, parse_connection_string
from .enums import ServiceBusDisposition, ServiceBusReceiveMode, ServiceBusSubQueue
from .exceptions import InvalidArgumentError
from .message import ServiceBusMessageBatch, ServiceBusReceivedMessage

__all__ = [
    "AutoLockRenewer",
    "ServiceBusClient",
    "ServiceBusProcessor",
    "ServiceBusReceiver",
    "ServiceBusRuleManager",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusTransaction",
    "connect",
]


class ServiceBusSender(SenderFromConnectionString):
    """Sends messages to one queue (see ``raybus.aio.ServiceBusSender`` for guarantees)."""

    _SYNC = True  # what _from_connection_string makes it with: the sync client

    def __init__(self, inner: aio.ServiceBusSender) -> None:
        self._aio = inner
        self.entity_path = self.entity_name = inner.entity_path
        self.client_identifier = inner.client_identifier
        self.fully_qualified_namespace = inner.fully_qualified_namespace

    def send_messages(
        self,
        message: SendInput,
        *,
        timeout: float | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        if transaction is not None:
            run(self._aio.send_messages(message, timeout=timeout, transaction=transaction._aio))
            return
        # Without a timeout, send from this thread (no hop through the loop); one thread's
        # sends cannot be coalesced with each other anyway.
        if timeout is not None or not self._aio.send_blocking(_records(message)):
            run(self._aio.send_messages(message, timeout=timeout))

    def schedule_messages(
        self,
        messages: SendInput,
        schedule_time_utc: datetime,
        *,
        timeout: float | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> list[int]:
        txn = None if transaction is None else transaction._aio
        return run(
            self._aio.schedule_messages(
                messages, schedule_time_utc, timeout=timeout, transaction=txn
            )
        )

    def cancel_scheduled_messages(
        self, sequence_numbers: int | Iterable[int], *, timeout: float | None = None
    ) -> None:
        run(self._aio.cancel_scheduled_messages(sequence_numbers, timeout=timeout))

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        return run(self._aio.create_message_batch(max_size_in_bytes))

    def close(self) -> None:
        run(self._aio.close())

    def __enter__(self) -> ServiceBusSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServiceBusReceiver(ReceiverFromConnectionString):
    """Receives from one queue (see ``raybus.aio.ServiceBusReceiver`` for guarantees,
    including when settlement waits for the broker)."""

    _SYNC = True  # what _from_connection_string makes it with: the sync client

    def __init__(self, inner: aio.ServiceBusReceiver) -> None:
        self._aio = inner
        self.entity_path = inner.entity_path
        self.client_identifier = inner.client_identifier
        self.fully_qualified_namespace = inner.fully_qualified_namespace
        self.session = None if inner.session is None else ServiceBusSession(inner.session)

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        inner = self._aio
        if inner._renewer is not None or not inner.direct_pays(
            inner._conn.cached_route(inner.entity_path)
        ):
            return run(inner.receive_messages(max_message_count, max_wait_time))
        # The same steps as the coroutine, waiting in this thread: no hop through the loop.
        ready, count, fetch, deadline = inner._receive_start(max_message_count, max_wait_time)
        if ready:
            return ready
        if inner._stands() or inner._standing_waits.out_at(0):
            # Its standing request, or the wait an earlier receive that found nothing left at
            # the partition (``aio._fanout.receive_single``), lives on raybus's loop, as the
            # asyncio receiver's does: wait there, the buffer being empty.
            return run(inner._receive_rest(count, fetch, deadline))
        handed_before = inner._handed
        while True:
            args = inner._receive_args(fetch, deadline)
            waiter = inner._new_waiter(0)  # close() from another thread ends its wait
            try:
                result = inner.call_blocking("receive", *args, waiter, returns=args[-1])
            finally:
                inner._waits.pop(waiter, None)
            if result is None:  # closed meanwhile (see below), or the route went stale
                if inner._closing:
                    return []
                return run(inner.receive_messages(max_message_count, max_wait_time))
            rows = inner._rows(result, args[-1])
            # close() (from another thread) ends the wait (``end_waits``).
            if rows:
                inner._standing_waits.found_some()
                break
            if inner._closing:
                break
            if _past(deadline):
                if inner._standing_waits.found_nothing():  # as receive_single does
                    _sync.loop().call_soon_threadsafe(inner._leave_wait)
                break
        # Settlements sent before this call ran alongside it; report a refusal now, giving
        # back what this call received, as when close() started meanwhile (then it returns
        # none: ``raybus.aio._receiver``'s docstring).
        inner.wait_answers_blocking(handed_before)
        out = inner._receive_done(rows, count)
        if out is None:
            run(inner._release_rows(rows))
            inner._raise_failures()
            return []
        return out

    def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: Any = None
    ) -> list[ServiceBusReceivedMessage]:
        return run(
            self._aio.peek_messages(
                max_message_count, sequence_number=sequence_number, timeout=timeout
            )
        )

    def receive_deferred_messages(
        self, sequence_numbers: int | Iterable[int], *, timeout: Any = None
    ) -> list[ServiceBusReceivedMessage]:
        return run(self._aio.receive_deferred_messages(sequence_numbers, timeout=timeout))

    def delete_messages(
        self,
        max_message_count: int,
        *,
        before_enqueued_time_utc: datetime | None = None,
        timeout: Any = None,
    ) -> int:
        return run(
            self._aio.delete_messages(
                max_message_count,
                before_enqueued_time_utc=before_enqueued_time_utc,
                timeout=timeout,
            )
        )

    def purge_messages(
        self, *, before_enqueued_time_utc: datetime | None = None, timeout: Any = None
    ) -> int:
        return run(
            self._aio.purge_messages(
                before_enqueued_time_utc=before_enqueued_time_utc, timeout=timeout
            )
        )

    def _settle(
        self,
        message: ServiceBusReceivedMessage,
        op: SettleOp,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        if transaction is not None:
            run(self._aio._in_transaction(transaction._aio, message, op))
            return
        # Fast path: hand the settlement over without waiting for the loop thread (the
        # receiver's settlement guarantee applies); otherwise run the waiting coroutine.
        if not self._aio.settle_from_thread(message, op, _sync.loop()):
            run(self._aio._settle(message, op))

    def complete_message(
        self,
        message: ServiceBusReceivedMessage,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        self._settle(message, SettleOp(COMPLETE, lock_token_of(message)), transaction)

    def complete_messages(self, messages: Sequence[ServiceBusReceivedMessage]) -> None:
        inner = self._aio
        route = inner._conn.cached_route(inner.entity_path)
        if not inner.direct_pays(route):
            run(inner.complete_messages(messages))
            return
        # The coroutine's steps, with the one settle call made from this thread (no hop
        # through the loop). Settlements sent without waiting are answered first.
        inner.wait_answers_blocking(inner._handed)
        by_partition = _complete.plan(inner, messages)  # raises before anything is sent
        if set(by_partition) - {0}:  # received before a partition change: the general path
            run(inner.complete_messages(messages))
            return
        earlier = inner._take_failures()
        failures: _complete.Failures = []
        for items in by_partition.values():
            ops = _complete.wire(items)
            try:
                # The same call may refill the prefetch buffer; close() from another thread
                # waits for it (``raybus.aio._prefetch``).
                results = inner.settle_refilling_blocking(ops)
                if results is None:  # the route went stale meanwhile: the loop resolves it
                    results = run(inner._call("settle", ops))
            except BaseException as exc:
                results = exc
            _complete.apply_results(items, results, failures)
        _complete.raise_failures(inner.entity_path, failures, len(messages), earlier)

    def abandon_message(
        self,
        message: ServiceBusReceivedMessage,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        op = SettleOp(ABANDON, lock_token_of(message), properties_to_modify)
        self._settle(message, op, transaction)

    def defer_message(
        self,
        message: ServiceBusReceivedMessage,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        op = SettleOp(DEFER, lock_token_of(message), properties_to_modify)
        self._settle(message, op, transaction)

    def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        self._settle(
            message,
            SettleOp(
                DEAD_LETTER,
                lock_token_of(message),
                properties_to_modify,
                reason,
                error_description,
            ),
            transaction,
        )

    def renew_message_lock(
        self,
        message: ServiceBusReceivedMessage,
        *,
        timeout: Any = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> datetime | None:
        txn = None if transaction is None else transaction._aio
        return run(self._aio.renew_message_lock(message, timeout=timeout, transaction=txn))

    def settle_message_by_lock_token(
        self,
        lock_token: str,
        disposition: ServiceBusDisposition | str,
        *,
        sequence_number: int | None = None,
        properties_to_modify: dict[str, Any] | None = None,
        dead_letter_reason: str | None = None,
        dead_letter_error_description: str | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Settle by lock token, waiting for the broker (see
        ``raybus.aio.ServiceBusReceiver.settle_message_by_lock_token``)."""
        run(
            self._aio.settle_message_by_lock_token(
                lock_token,
                disposition,
                sequence_number=sequence_number,
                properties_to_modify=properties_to_modify,
                dead_letter_reason=dead_letter_reason,
                dead_letter_error_description=dead_letter_error_description,
                transaction=None if transaction is None else transaction._aio,
            )
        )

    def renew_message_lock_by_lock_token(
        self,
        lock_token: str,
        *,
        sequence_number: int | None = None,
        timeout: Any = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> datetime:
        """Renew a lock by its token (see ``raybus.aio.ServiceBusReceiver``)."""
        return run(
            self._aio.renew_message_lock_by_lock_token(
                lock_token,
                sequence_number=sequence_number,
                timeout=timeout,
                transaction=None if transaction is None else transaction._aio,
            )
        )

    def __iter__(self) -> ServiceBusReceiver:
        """The receiver is its own iterator (see ``raybus.aio.ServiceBusReceiver.__aiter__``)."""
        return self

    def __next__(self) -> ServiceBusReceivedMessage:
        batch = self.receive_messages(1)  # the rest of a prefetch stays in the buffer
        if not batch:
            raise StopIteration
        return batch[0]

    next = __next__  # the SDK's alias

    def close(self) -> None:
        run(self._aio.close())

    def __enter__(self) -> ServiceBusReceiver:
        run(self._aio.__aenter__())  # a session receiver accepts its session here
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServiceBusSession:
    """The session of a session receiver (see ``raybus.aio.ServiceBusSession``)."""

    def __init__(self, inner: aio.ServiceBusSession) -> None:
        self._aio = inner

    @property
    def session_id(self) -> str | None:
        return self._aio.session_id

    @property
    def locked_until_utc(self) -> datetime | None:
        return self._aio.locked_until_utc

    @property
    def auto_renew_error(self) -> BaseException | None:
        return self._aio.auto_renew_error

    def get_state(self, *, timeout: Any = None) -> bytes | None:
        return run(self._aio.get_state(timeout=timeout))

    def set_state(self, state: str | bytes | bytearray | None, *, timeout: Any = None) -> None:
        run(self._aio.set_state(state, timeout=timeout))

    def renew_lock(self, *, timeout: Any = None) -> datetime:
        return run(self._aio.renew_lock(timeout=timeout))


class ServiceBusTransaction:
    """A transaction (see ``raybus.aio.ServiceBusTransaction`` for its guarantees):
    ``with client.transaction() as txn:`` commits on a clean exit, rolls back on an error."""

    def __init__(self, inner: aio.ServiceBusTransaction) -> None:
        self._aio = inner

    @property
    def transaction_id(self) -> str:
        return self._aio.transaction_id

    @property
    def state(self) -> str:
        return self._aio.state

    def commit(self) -> None:
        run(self._aio.commit())

    def rollback(self) -> None:
        run(self._aio.rollback())

    def __enter__(self) -> ServiceBusTransaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        run(self._aio.__aexit__(exc_type, exc, tb))


class ServiceBusRuleManager:
    """One subscription's rules, managed with Listen rights (see
    ``raybus.aio.ServiceBusRuleManager``): ``client.get_rule_manager(topic, subscription)``."""

    def __init__(self, inner: aio.ServiceBusRuleManager) -> None:
        self._aio = inner

    @property
    def topic_name(self) -> str:
        return self._aio.topic_name

    @property
    def subscription_name(self) -> str:
        return self._aio.subscription_name

    @property
    def subscription_path(self) -> str:
        return self._aio.subscription_path

    def create_rule(
        self, rule_name: str, *, filter: Any = None, action: SqlRuleAction | None = None
    ) -> RuleProperties:
        return run(self._aio.create_rule(rule_name, filter=filter, action=action))

    def delete_rule(self, rule_name: str) -> None:
        run(self._aio.delete_rule(rule_name))

    def list_rules(self) -> list[RuleProperties]:
        return ItemList(run(self._aio.list_rules()))

    def close(self) -> None:
        run(self._aio.close())

    def __enter__(self) -> ServiceBusRuleManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AutoLockRenewer:
    """Renews locks of registered messages (see ``raybus.aio.AutoLockRenewer``).

    The renewals run on raybus's background loop. ``on_lock_renew_failure`` runs in
    ``executor`` if one is given, else in a pool of ``max_workers`` threads if that is given
    (shut down by ``close``): there it may call the sync raybus API (settle the message, say).
    With neither it runs on the loop's thread and must not. (The SDK runs its renewals in that
    executor too; here they need no thread.)
    """

    def __init__(
        self,
        max_lock_renewal_duration: float = 300,
        on_lock_renew_failure: Any = None,
        executor: Executor | None = None,
        max_workers: int | None = None,
    ) -> None:
        if executor is not None and not callable(getattr(executor, "submit", None)):
            raise InvalidArgumentError(
                f"executor must be a concurrent.futures.Executor, not {type(executor).__name__}",
                None,
                "executor",
            )
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
        ):
            raise InvalidArgumentError(
                f"max_workers must be a positive int or None, not {max_workers!r}",
                None,
                "max_workers",
            )
        self._own_pool: ThreadPoolExecutor | None = None
        if executor is None and max_workers is not None:
            self._own_pool = ThreadPoolExecutor(max_workers, "raybus-renew-failure")
        self._executor = executor or self._own_pool
        self._aio = aio.AutoLockRenewer(
            max_lock_renewal_duration, self._in_executor(on_lock_renew_failure)
        )

    def _in_executor(self, callback: Any) -> Any:
        """``callback``, handed to the executor when there is one (class docstring)."""
        executor = self._executor
        if callback is None or executor is None:
            return callback

        def hand_over(renewable: Any, error: BaseException | None) -> None:
            executor.submit(callback, renewable, error)

        return hand_over

    def register(
        self,
        receiver: ServiceBusReceiver,
        renewable: ServiceBusReceivedMessage | ServiceBusSession,
        max_lock_renewal_duration: float | None = None,
        on_lock_renew_failure: Any = None,
    ) -> None:
        inner = renewable._aio if isinstance(renewable, ServiceBusSession) else renewable

        async def _register() -> None:
            self._aio.register(
                receiver._aio,
                inner,
                max_lock_renewal_duration,
                self._in_executor(on_lock_renew_failure),
            )

        run(_register())

    def close(self, wait: bool = True) -> None:
        """Stop renewing; with ``wait``, also wait for callbacks running in the renewer's own
        pool (``max_workers``). A given ``executor`` is the caller's to shut down."""
        run(self._aio.close())
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=wait)

    def __enter__(self) -> AutoLockRenewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServiceBusProcessor:
    """Runs a handler on a queue's messages in an elastic pool of Ray actors (see
    ``raybus.aio.ServiceBusProcessor`` for the options and guarantees).

    Its controller runs on raybus's background loop. A plain-function ``error_handler`` runs in
    a worker thread (so it may call the sync raybus API); a coroutine function runs on that
    loop. ``statistics`` may be read from any thread.
    """

    def __init__(self, inner: aio.ServiceBusProcessor) -> None:
        self._aio = inner
        self.entity_path = inner.entity_path

    @property
    def statistics(self) -> ProcessorStatistics:
        return self._aio.statistics

    @property
    def is_running(self) -> bool:
        return self._aio.is_running

    def start(self) -> None:
        run(self._aio.start())

    def stop(self, *, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        run(self._aio.stop(timeout=timeout))

    def __enter__(self) -> ServiceBusProcessor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServiceBusClient:
    """Connects to a raybus namespace (see ``raybus.aio.ServiceBusClient``)."""

    def __init__(
        self,
        namespace: str | None = None,
        credential: CredentialLike | None = None,
        *,
        fully_qualified_namespace: str | None = None,
        address: str | None = None,
        storage_path: str | None = None,
        retry_total: int = 3,
        retry_backoff_factor: float = 0.8,
        retry_backoff_max: float = 120,
        retry_mode: RetryMode | str = RetryMode.EXPONENTIAL,
        **transport_options: Any,
    ) -> None:
        self._aio = aio.ServiceBusClient(
            namespace,
            credential,
            fully_qualified_namespace=fully_qualified_namespace,
            address=address,
            storage_path=storage_path,
            retry_total=retry_total,
            retry_backoff_factor=retry_backoff_factor,
            retry_backoff_max=retry_backoff_max,
            retry_mode=retry_mode,
            **transport_options,
        )
        self.namespace = self._aio.namespace

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client for a Service Bus connection string (see
        ``raybus.aio.ServiceBusClient.from_connection_string``)."""
        info = parse_connection_string(conn_str, kwargs)
        client = cls(info.namespace, credential=info.credential, **kwargs)
        client._aio._take_connection_string(info)
        return client

    @property
    def fully_qualified_namespace(self) -> str:
        """The SDK's: the host name given (a connection string's endpoint host), else the
        namespace."""
        return self._aio.fully_qualified_namespace

    def get_queue_sender(
        self,
        queue_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        return ServiceBusSender(
            self._aio.get_queue_sender(
                queue_name, client_identifier=client_identifier, socket_timeout=socket_timeout
            )
        )

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        return ServiceBusReceiver(
            self._aio.get_queue_receiver(
                queue_name,
                session_id=session_id,
                sub_queue=sub_queue,
                receive_mode=receive_mode,
                max_wait_time=max_wait_time,
                auto_lock_renewer=None if auto_lock_renewer is None else auto_lock_renewer._aio,
                prefetch_count=prefetch_count,
                client_identifier=client_identifier,
                socket_timeout=socket_timeout,
            )
        )

    def get_topic_sender(
        self,
        topic_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        return ServiceBusSender(
            self._aio.get_topic_sender(
                topic_name, client_identifier=client_identifier, socket_timeout=socket_timeout
            )
        )

    def get_subscription_receiver(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        session_id: Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: AutoLockRenewer | None = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        return ServiceBusReceiver(
            self._aio.get_subscription_receiver(
                topic_name,
                subscription_name,
                session_id=session_id,
                sub_queue=sub_queue,
                receive_mode=receive_mode,
                max_wait_time=max_wait_time,
                auto_lock_renewer=None if auto_lock_renewer is None else auto_lock_renewer._aio,
                prefetch_count=prefetch_count,
                client_identifier=client_identifier,
                socket_timeout=socket_timeout,
            )
        )

    def get_rule_manager(self, topic_name: str, subscription_name: str) -> ServiceBusRuleManager:
        """A manager of the subscription's rules that needs only Listen rights (.NET's
        ``CreateRuleManager``; see ``raybus.aio.ServiceBusRuleManager``)."""
        return ServiceBusRuleManager(self._aio.get_rule_manager(topic_name, subscription_name))

    def list_subscription_sessions(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        state_updated_after: datetime | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        return ItemList(
            run(
                self._aio.list_subscription_sessions(
                    topic_name,
                    subscription_name,
                    state_updated_after=state_updated_after,
                    timeout=timeout,
                )
            )
        )

    def resolve_entity(self, entity_path: str) -> EntityInfo:
        """An entity's settings (see ``raybus.aio.ServiceBusClient.resolve_entity``)."""
        return run(self._aio.resolve_entity(entity_path))

    def transaction(self) -> ServiceBusTransaction:
        """A new transaction (``with client.transaction() as txn:``)."""
        return ServiceBusTransaction(self._aio.transaction())

    def get_processor(
        self,
        queue_name: str | tuple[str, str],
        handler: Handler,
        *,
        max_concurrent_calls: int = 1,
        auto_complete: bool = True,
        prefetch_count: int = 0,
        max_auto_lock_renewal_duration: Seconds = 300.0,
        error_handler: Any = None,
        session: bool | None = None,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        target_backlog_per_replica: int = 100,
        scale_down_delay: Seconds = 5.0,
        actor_options: dict[str, Any] | None = None,
    ) -> ServiceBusProcessor:
        """See ``raybus.aio.ServiceBusClient.get_processor``."""
        return ServiceBusProcessor(
            self._aio.get_processor(
                queue_name,
                handler,
                max_concurrent_calls=max_concurrent_calls,
                auto_complete=auto_complete,
                prefetch_count=prefetch_count,
                max_auto_lock_renewal_duration=max_auto_lock_renewal_duration,
                error_handler=in_thread(error_handler),
                session=session,
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                target_backlog_per_replica=target_backlog_per_replica,
                scale_down_delay=scale_down_delay,
                actor_options=actor_options,
            )
        )

    def list_queue_sessions(
        self,
        queue_name: str,
        *,
        state_updated_after: datetime | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        return ItemList(
            run(
                self._aio.list_queue_sessions(
                    queue_name, state_updated_after=state_updated_after, timeout=timeout
                )
            )
        )

    def close(self) -> None:
        run(self._aio.close())

    def __enter__(self) -> ServiceBusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    namespace: str = "default",
    address: str | None = None,
    *,
    storage_path: str | None = None,
    credential: CredentialLike | None = None,
) -> ServiceBusClient:
    """Join the Ray cluster at ``address`` (default: the local one, started if needed) and
    the raybus ``namespace`` (its registry actor is created if it does not exist yet; with
    ``storage_path`` it is durable and finds its entities and messages there again). For the
    retry options, make a ``ServiceBusClient``."""
    return ServiceBusClient(
        namespace, address=address, storage_path=storage_path, credential=credential
    )
