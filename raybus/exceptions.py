"""The errors raybus raises, with the names azure-servicebus users already catch.

Every class here:

* is an azure-core ``AzureError``, as azure-servicebus's errors are, so code written for the
  SDK that catches ``AzureError`` catches raybus's; the errors the administration client
  raises for a missing entity, an existing one and a refused token are also azure-core's
  ``ResourceNotFoundError`` (404), ``ResourceExistsError`` (409) and
  ``ClientAuthenticationError`` (401), which the SDK's administration client raises, with
  their ``status_code`` and ``reason``;
* can be built as the SDK builds its errors, by keywords (``MessageLockLostError()``,
  ``MessageLockLostError(message="...", error=cause)``): the text defaults to the class's
  own, and ``error`` is kept as ``inner_exception``, in this process only;
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

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ResourceExistsError,
    ResourceNotFoundError,
)

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


class ServiceBusError(AzureError):
    """Base of every raybus error (an azure-core ``AzureError``, as the SDK's).

    ``message`` is the human text (the class's own when not given; bytes are read as UTF-8);
    ``entity`` names the queue (or other entity) involved when there is one; ``error``, a
    keyword, is the exception that caused this one (``inner_exception``; not carried across
    processes). Catch this to handle any broker failure; check ``retryable`` to decide
    whether to try again.
    """

    retryable: bool = False
    #: The text of an error built without one (the SDK's errors have one each).
    default_message = "Service Bus has encountered an error."
    #: The HTTP status and reason of a class that is also an azure-core ``HttpResponseError``.
    _http: tuple[int, str] | None = None

    def __init__(
        self,
        message: str | bytes | None = None,
        entity: str | None = None,
        *args: Any,
        error: BaseException | None = None,
    ) -> None:
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        text = message or self.default_message
        # AzureError's own, not the next class's: an HttpResponseError's takes a response.
        AzureError.__init__(self, text, entity, *args, error=error)
        self.message = text
        self.entity = entity
        if self._http is not None:  # HttpResponseError's fields, as its __init__ sets them
            status, reason = self._http
            vars(self).update(
                status_code=status, reason=reason, response=None, model=None, error=None
            )

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

    default_message = "An argument is invalid."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        argument: str | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, argument, error=error)
        self.argument = argument


class ServiceBusConnectionError(ServiceBusError):
    """The broker could not be reached (an actor is restarting or its node is gone).

    The operation may or may not have taken effect. Retry after a short back-off; make the
    processing idempotent.
    """

    default_message = "An error occurred in the connection."

    retryable = True


class ServiceBusCommunicationError(ServiceBusConnectionError):
    """The client could not reach the cluster at all: Ray could not be joined or started
    (azure-servicebus raises it when the namespace's host cannot be reached). Nothing was
    done. A ``ServiceBusConnectionError``, so code catching that catches this too (the SDK's
    are siblings)."""

    default_message = "The cluster could not be reached."


class ServiceBusAuthenticationError(ServiceBusError, ClientAuthenticationError):
    """The namespace has access control and the call carried no token, or a token that is
    malformed, expired, or not signed by any current key. Nothing was done. Get a fresh token
    (or the right key) and call again. Also azure-core's ``ClientAuthenticationError`` (401),
    which the SDK's administration client raises."""

    default_message = "An error occurred when authenticating the connection."
    _http = (401, "Unauthorized")


class ServiceBusAuthorizationError(ServiceBusError, ClientAuthenticationError):
    """The token is valid but its rule lacks the right this call needs (``Send``, ``Listen`` or
    ``Manage``) or does not cover this entity. Nothing was done; retrying will not help. Also
    azure-core's ``ClientAuthenticationError`` (401), which the SDK's administration client
    raises."""

    default_message = "An error occurred when authorizing the connection."
    _http = (401, "Unauthorized")


class ServiceBusServerBusyError(ServiceBusError):
    """The broker cannot take the request now; nothing was stored. Retry after a back-off of a
    few seconds.

    Raised by a topic publish while one of its subscriptions' partitions has not taken an
    earlier publish (it is restarting, or its storage fails): the earlier one goes first.
    """

    default_message = "The broker is busy: retry after a back-off."

    retryable = True


class OperationTimeoutError(ServiceBusError):
    """The operation did not finish in time; its outcome is unknown.

    Retry it; sends are safe to retry with duplicate detection on, settlements are idempotent
    on the lock token.
    """

    default_message = "Operation timed out."

    retryable = True


class MessageSizeExceededError(ServiceBusError, ValueError):
    """A message (or batch) is larger than the entity allows. Nothing was stored.

    ``size`` is the size in bytes, ``max_size`` the limit. Send smaller messages, split the
    batch, or raise the entity's ``max_message_size_in_kilobytes``.
    """

    default_message = "The message is larger than the entity allows."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        size: int = 0,
        max_size: int = 0,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, size, max_size, error=error)
        self.size = size
        self.max_size = max_size


class MessageAlreadySettled(ValueError):
    """The message was already settled by this receiver, was only peeked, or was received
    in RECEIVE_AND_DELETE mode. Nothing was sent to the broker; do not settle it again.
    """

    retryable = False

    def __init__(self, message: str | None = None, *args: Any, action: str | None = None):
        # The SDK's takes only ``action`` (the settlement tried) and words its text by it.
        if message is None:
            message = (
                f"Unable to {action} message; the message has either been deleted or"
                " already settled."
                if action
                else "The message has already been settled."
            )
        super().__init__(message, *args)
        self.message = message


class MessageLockLostError(ServiceBusError):
    """The message's lock expired or was lost (it may already be delivered to another receiver).

    The settlement did not happen and the message was not changed by it. Process idempotently:
    the message will be (or already was) delivered again. Shorten processing, renew the lock,
    or raise the entity's ``lock_duration``.
    """

    default_message = "The lock on the message has expired: receive and process the message again."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        lock_token: str | None = None,
        sequence_number: int | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, lock_token, sequence_number, error=error)
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

    default_message = "A settlement sent without waiting was refused by the broker."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        failures: list[tuple[int | None, str | None, str]] | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        first = failures[0] if failures else (None, None, "")
        super().__init__(message, entity, first[1], first[0], error=error)
        self.args = (self.message, entity, failures)
        self.failures = list(failures or [])


class SessionLockLostError(ServiceBusError):
    """The session lock expired or was lost; no message of the session can be settled any
    more through this receiver. Open a new session receiver."""

    default_message = "The lock on the session has expired: request the session again."


class SessionCannotBeLockedError(ServiceBusError):
    """Another receiver holds the session. Retry later or pick another session."""

    default_message = "The requested session cannot be locked."

    retryable = True


class PartitionMovedError(ServiceBusError):
    """The partition no longer serves that partition key (the entity's partition count
    changed). raybus's senders refresh their partition map and resend by themselves; you see
    this only if the map kept changing for a minute. Nothing of the refused share was stored.
    ``version`` is the partition's newest map version."""

    retryable = True

    default_message = "The partition no longer serves that partition key."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        version: int = 0,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, version, error=error)
        self.version = version


class MessageNotFoundError(ServiceBusError):
    """No message has that sequence number (it was completed, expired or never existed).

    ``sequence_numbers`` lists the ones not found. Nothing was locked or received by the call.
    """

    default_message = "The requested message was not found."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        sequence_numbers: list[int] | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, sequence_numbers, error=error)
        self.sequence_numbers = list(sequence_numbers or [])


class MessagesMovedError(MessageNotFoundError):
    """A partition change moved these messages to other partitions of the entity: ``moved``
    maps each sequence number asked for to the partition that holds it now. Raised by a
    partition for deferred or scheduled messages it gave away; raybus's clients call the new
    partition by themselves, so you see this only if the messages kept moving. It is a
    ``MessageNotFoundError``: nothing was locked, received or cancelled by the call."""

    default_message = "A partition change moved the messages to other partitions."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        sequence_numbers: list[int] | None = None,
        moved: dict[int, int] | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, sequence_numbers, error=error)
        self.moved = dict(moved or {})
        self.args = (*self.args, self.moved)


class TransactionAbortedError(ServiceBusError):
    """The transaction was rolled back: none of its operations took effect (its sends were
    discarded; the messages it would have settled are still locked by you, until their locks
    end). ``reason`` says why (the first participant's refusal, as "TypeName: text") and
    ``cause`` is that refusal itself (a raybus exception, or None). Fix the cause and run the
    operations again in a new transaction."""

    default_message = "The transaction was rolled back."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        transaction_id: str | None = None,
        reason: str | None = None,
        cause: BaseException | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, transaction_id, reason, cause, error=error)
        self.transaction_id = transaction_id
        self.reason = reason
        self.cause = cause


class TransactionSizeExceededError(ServiceBusError):
    """A transaction may hold at most 100 messages (sent and settled together). The
    operation was not added; commit what the transaction holds, then start another."""

    default_message = "A transaction may hold at most 100 messages."


class TransactionTimeoutError(TransactionAbortedError):
    """The transaction was not committed within two minutes of its first operation and was
    rolled back. Start a new transaction and commit sooner."""

    default_message = "The transaction was not committed in time and was rolled back."


class MessagingEntityNotFoundError(ServiceBusError, ResourceNotFoundError):
    """The queue (or topic, subscription) does not exist, or was deleted. Create it first.
    Also azure-core's ``ResourceNotFoundError`` (404), which the SDK's administration client
    raises."""

    default_message = "The messaging entity was not found."
    _http = (404, "Not Found")


class MessagingEntityDisabledError(ServiceBusError):
    """The entity's status forbids this operation (Disabled, SendDisabled or ReceiveDisabled).

    Its messages are kept. Retry once an administrator has set the status back to Active.
    """

    retryable = True

    default_message = "The messaging entity is disabled."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        status: str | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, status, error=error)
        self.status = status


class MessagingEntityAlreadyExistsError(ServiceBusError, ResourceExistsError):
    """An entity with that name (names are case-insensitive) already exists. Use it, or
    delete it first. Also azure-core's ``ResourceExistsError`` (409), which the SDK's
    administration client raises."""

    default_message = "An entity with the same name exists under the same namespace."
    _http = (409, "Conflict")


class ServiceBusQuotaExceededError(ServiceBusError):
    """The entity is full (``max_size_in_megabytes``) or another quota was hit. Nothing was
    stored. Receive and settle messages to make room, or raise the quota."""

    default_message = "The entity is full, or another quota was reached."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        size: int = 0,
        max_size: int = 0,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, size, max_size, error=error)
        self.size = size
        self.max_size = max_size


class AutoLockRenewFailed(ServiceBusError):
    """Automatic lock renewal failed; the lock will expire. Stop processing the message."""

    default_message = "Renewing the lock in the background failed."


class AutoLockRenewTimeout(ServiceBusError):
    """Automatic lock renewal stopped because ``max_lock_renewal_duration`` elapsed."""

    default_message = "The time allowed for renewing the lock has elapsed."


class FilterSyntaxError(ServiceBusError):
    """A SQL rule filter or action text is malformed, longer than 1,024 characters, nests too
    deeply, or names a parameter that was not supplied.

    ``text`` is the offending text and ``position`` the 0-based character offset of the problem
    (``None`` when it is not tied to one place, e.g. a bad parameter value). Nothing was created
    or changed. Fix the expression (or its parameters); retrying unchanged fails again.
    """

    default_message = "The SQL expression is malformed."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        text: str | None = None,
        position: int | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, text, position, error=error)
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

    default_message = "Evaluating a SQL rule against the message failed."

    def __init__(
        self,
        message: str | None = None,
        entity: str | None = None,
        type_name: str = "FilterEvaluationError",
        *,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(message, entity, type_name, error=error)
        self.type_name = type_name
