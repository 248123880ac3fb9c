"""The errors raybus raises, with the names azure-servicebus users already catch.

Every class here:

* pickles, so it crosses from a partition actor to the client unchanged (constructor
  arguments are passed positionally to ``super().__init__`` and rebuilt from ``self.args``);
* carries structured fields (entity path, lock token, sequence number) besides its text;
* has a class-level ``retryable`` flag: ``True`` means the same call may succeed if repeated
  later (after a back-off), ``False`` means repeating it unchanged will fail again.

No Ray exception escapes a public raybus method: the one place that makes remote calls
(``raybus._rpc``) translates them into these classes.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AutoLockRenewFailed",
    "AutoLockRenewTimeout",
    "FilterEvaluationError",
    "FilterSyntaxError",
    "InvalidArgumentError",
    "MessageAlreadySettled",
    "MessageLockLostError",
    "MessageNotFoundError",
    "MessageSizeExceededError",
    "MessagesMovedError",
    "MessagingEntityAlreadyExistsError",
    "MessagingEntityDisabledError",
    "MessagingEntityNotFoundError",
    "OperationTimeoutError",
    "PartitionMovedError",
    "ServiceBusAuthenticationError",
    "ServiceBusAuthorizationError",
    "ServiceBusCommunicationError",
    "ServiceBusConnectionError",
    "ServiceBusError",
    "ServiceBusQuotaExceededError",
    "ServiceBusServerBusyError",
    "SessionCannotBeLockedError",
    "SessionLockLostError",
    "SettlementFailedError",
    "TransactionAbortedError",
    "TransactionSizeExceededError",
    "TransactionTimeoutError",
]


class ServiceBusError(Exception):
    """Base of every raybus error.

    ``message`` is the human text; ``entity`` names the queue (or other entity) involved when
    there is one. Catch this to handle any broker failure; check ``retryable`` to decide
    whether to try again.
    """

    retryable: bool = False

    def __init__(self, message: str, entity: str | None = None, *args: Any) -> None:
        super().__init__(message, entity, *args)
        self.message = message
        self.entity = entity

    def __str__(self) -> str:
        if self.entity:
            return f"{self.message} (entity: {self.entity})"
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the positional arguments so subclasses with extra fields survive pickling
        # across actor boundaries without keyword-only constructors.
        return (type(self), self.args)


class InvalidArgumentError(ServiceBusError, ValueError):
    """An argument is out of range or of the wrong type; ``argument`` names it.

    Nothing was sent or stored. Fix the argument; retrying unchanged fails again.
    """

    def __init__(self, message: str, entity: str | None = None, argument: str | None = None):
        super().__init__(message, entity, argument)
        self.argument = argument


class ServiceBusConnectionError(ServiceBusError):
    """The broker could not be reached (an actor is restarting or its node is gone).

    The operation may or may not have taken effect. Retry after a short back-off; make the
    processing idempotent.
    """

    retryable = True


class ServiceBusCommunicationError(ServiceBusConnectionError):
    """The client could not reach the cluster at all: Ray could not be joined or started
    (azure-servicebus raises it when the namespace's host cannot be reached). Nothing was
    done. A ``ServiceBusConnectionError``, so code catching that catches this too."""


class ServiceBusAuthenticationError(ServiceBusError):
    """The namespace has access control and the call carried no token, or a token that is
    malformed, expired, or not signed by any current key. Nothing was done. Get a fresh token
    (or the right key) and call again."""


class ServiceBusAuthorizationError(ServiceBusError):
    """The token is valid but its rule lacks the right this call needs (``Send``, ``Listen`` or
    ``Manage``) or does not cover this entity. Nothing was done; retrying will not help."""


class ServiceBusServerBusyError(ServiceBusError):
    """The broker cannot take the request now; nothing was stored. Retry after a back-off of a
    few seconds.

    Raised by a topic publish while one of its subscriptions' partitions has not taken an
    earlier publish (it is restarting, or its storage fails): the earlier one goes first.
    """

    retryable = True


class OperationTimeoutError(ServiceBusError):
    """The operation did not finish in time; its outcome is unknown.

    Retry it; sends are safe to retry with duplicate detection on, settlements are idempotent
    on the lock token.
    """

    retryable = True


class MessageSizeExceededError(ServiceBusError, ValueError):
    """A message (or batch) is larger than the entity allows. Nothing was stored.

    ``size`` is the size in bytes, ``max_size`` the limit. Send smaller messages, split the
    batch, or raise the entity's ``max_message_size_in_kilobytes``.
    """

    def __init__(
        self, message: str, entity: str | None = None, size: int = 0, max_size: int = 0
    ) -> None:
        super().__init__(message, entity, size, max_size)
        self.size = size
        self.max_size = max_size


class MessageAlreadySettled(ValueError):
    """The message was already settled by this receiver, was only peeked, or was received
    in RECEIVE_AND_DELETE mode. Nothing was sent to the broker; do not settle it again.
    """

    retryable = False

    def __init__(self, message: str = "The message has already been settled.", *args: Any):
        super().__init__(message, *args)
        self.message = message


class MessageLockLostError(ServiceBusError):
    """The message's lock expired or was lost (it may already be delivered to another receiver).

    The settlement did not happen and the message was not changed by it. Process idempotently:
    the message will be (or already was) delivered again. Shorten processing, renew the lock,
    or raise the entity's ``lock_duration``.
    """

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        lock_token: str | None = None,
        sequence_number: int | None = None,
    ) -> None:
        super().__init__(message, entity, lock_token, sequence_number)
        self.lock_token = lock_token
        self.sequence_number = sequence_number


class SettlementFailedError(MessageLockLostError):
    """A settlement that the client sent without waiting was refused by the broker.

    raybus settles messages whose lock is comfortably valid without waiting for the broker's
    answer; when the broker refuses one (its lock was lost, e.g. to an actor restart) the next
    call on the same receiver, or its ``close()``, raises this. ``failures`` lists the
    (sequence number, lock token, reason) of each refused settlement. The messages were not
    settled and will be delivered again.
    """

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        failures: list[tuple[int | None, str | None, str]] | None = None,
    ) -> None:
        first = failures[0] if failures else (None, None, "")
        super().__init__(message, entity, first[1], first[0])
        self.args = (message, entity, failures)
        self.failures = list(failures or [])


class SessionLockLostError(ServiceBusError):
    """The session lock expired or was lost; no message of the session can be settled any
    more through this receiver. Open a new session receiver."""


class SessionCannotBeLockedError(ServiceBusError):
    """Another receiver holds the session. Retry later or pick another session."""

    retryable = True


class PartitionMovedError(ServiceBusError):
    """The partition no longer serves that partition key (the entity's partition count
    changed). raybus's senders refresh their partition map and resend by themselves; you see
    this only if the map kept changing for a minute. Nothing of the refused share was stored.
    ``version`` is the partition's newest map version."""

    retryable = True

    def __init__(self, message: str, entity: str | None = None, version: int = 0) -> None:
        super().__init__(message, entity, version)
        self.version = version


class MessageNotFoundError(ServiceBusError):
    """No message has that sequence number (it was completed, expired or never existed).

    ``sequence_numbers`` lists the ones not found. Nothing was locked or received by the call.
    """

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        sequence_numbers: list[int] | None = None,
    ) -> None:
        super().__init__(message, entity, sequence_numbers)
        self.sequence_numbers = list(sequence_numbers or [])


class MessagesMovedError(MessageNotFoundError):
    """A partition change moved these messages to other partitions of the entity: ``moved``
    maps each sequence number asked for to the partition that holds it now. Raised by a
    partition for deferred or scheduled messages it gave away; raybus's clients call the new
    partition by themselves, so you see this only if the messages kept moving. It is a
    ``MessageNotFoundError``: nothing was locked, received or cancelled by the call."""

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        sequence_numbers: list[int] | None = None,
        moved: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message, entity, sequence_numbers)
        self.moved = dict(moved or {})
        self.args = (*self.args, self.moved)


class TransactionAbortedError(ServiceBusError):
    """The transaction was rolled back: none of its operations took effect (its sends were
    discarded; the messages it would have settled are still locked by you, until their locks
    end). ``reason`` says why (the first participant's refusal, as "TypeName: text") and
    ``cause`` is that refusal itself (a raybus exception, or None). Fix the cause and run the
    operations again in a new transaction."""

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        transaction_id: str | None = None,
        reason: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, transaction_id, reason, cause)
        self.transaction_id = transaction_id
        self.reason = reason
        self.cause = cause


class TransactionSizeExceededError(ServiceBusError):
    """A transaction may hold at most 100 messages (sent and settled together). The
    operation was not added; commit what the transaction holds, then start another."""


class TransactionTimeoutError(TransactionAbortedError):
    """The transaction was not committed within two minutes of its first operation and was
    rolled back. Start a new transaction and commit sooner."""


class MessagingEntityNotFoundError(ServiceBusError):
    """The queue (or topic, subscription) does not exist, or was deleted. Create it first."""


class MessagingEntityDisabledError(ServiceBusError):
    """The entity's status forbids this operation (Disabled, SendDisabled or ReceiveDisabled).

    Its messages are kept. Retry once an administrator has set the status back to Active.
    """

    retryable = True

    def __init__(self, message: str, entity: str | None = None, status: str | None = None):
        super().__init__(message, entity, status)
        self.status = status


class MessagingEntityAlreadyExistsError(ServiceBusError):
    """An entity with that name (names are case-insensitive) already exists. Use it, or
    delete it first."""


class ServiceBusQuotaExceededError(ServiceBusError):
    """The entity is full (``max_size_in_megabytes``) or another quota was hit. Nothing was
    stored. Receive and settle messages to make room, or raise the quota."""

    def __init__(
        self, message: str, entity: str | None = None, size: int = 0, max_size: int = 0
    ) -> None:
        super().__init__(message, entity, size, max_size)
        self.size = size
        self.max_size = max_size


class AutoLockRenewFailed(ServiceBusError):
    """Automatic lock renewal failed; the lock will expire. Stop processing the message."""


class AutoLockRenewTimeout(ServiceBusError):
    """Automatic lock renewal stopped because ``max_lock_renewal_duration`` elapsed."""


class FilterSyntaxError(ServiceBusError):
    """A SQL rule filter or action text is malformed, longer than 1,024 characters, nests too
    deeply, or names a parameter that was not supplied.

    ``text`` is the offending text and ``position`` the 0-based character offset of the problem
    (``None`` when it is not tied to one place, e.g. a bad parameter value). Nothing was created
    or changed. Fix the expression (or its parameters); retrying unchanged fails again.
    """

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        text: str | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(message, entity, text, position)
        self.text = text
        self.position = position


class FilterEvaluationError(ServiceBusError):
    """Evaluating a SQL rule filter or action against one message failed: a type mismatch, an
    integer overflow or division by zero, a missing system property, or a non-boolean filter
    result. ``type_name`` names the kind of failure (``"TypeMismatch"``, ``"DivideByZero"``,
    ``"Overflow"``, ``"MissingSystemProperty"``, ``"NotBoolean"``, ...).

    The broker dead-letters the message on the subscription whose rule failed, with
    ``type_name`` as the reason. Fix the rule, or the properties the sender sets; the same
    message fails the same way again.
    """

    def __init__(
        self,
        message: str,
        entity: str | None = None,
        type_name: str = "FilterEvaluationError",
    ) -> None:
        super().__init__(message, entity, type_name)
        self.type_name = type_name
