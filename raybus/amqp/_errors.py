"""raybus errors as the AMQP error conditions (and management status codes) the Azure SDK maps
back onto its own exceptions (``azure.servicebus._transport._pyamqp_transport``'s table)."""

from __future__ import annotations

from .. import exceptions as ex
from ._codec import DecodeError

__all__ = ["TransactionUnknownError", "condition_of", "status_of"]


class TransactionUnknownError(ex.InvalidArgumentError):
    """A transactional operation or discharge named a transaction id this connection has not
    declared (or has already discharged). Declare a transaction first."""


# Most specific first: subclasses (SettlementFailedError < MessageLockLostError) come before
# their bases.
_CONDITIONS: tuple[tuple[type[BaseException], str, int], ...] = (
    (TransactionUnknownError, "amqp:transaction:unknown-id", 400),
    (ex.TransactionTimeoutError, "amqp:transaction:timeout", 408),
    (ex.TransactionAbortedError, "amqp:transaction:rollback", 409),
    (ex.TransactionSizeExceededError, "amqp:resource-limit-exceeded", 403),
    (ex.ServiceBusAuthenticationError, "amqp:unauthorized-access", 401),
    (ex.ServiceBusAuthorizationError, "amqp:unauthorized-access", 401),
    (ex.MessagingEntityNotFoundError, "amqp:not-found", 404),
    (ex.MessageNotFoundError, "com.microsoft:message-not-found", 404),
    (ex.MessageSizeExceededError, "amqp:link:message-size-exceeded", 413),
    (ex.ServiceBusQuotaExceededError, "amqp:resource-limit-exceeded", 403),
    (ex.MessagingEntityDisabledError, "com.microsoft:entity-disabled", 400),
    (ex.MessagingEntityAlreadyExistsError, "com.microsoft:entity-already-exists", 409),
    (ex.MessageLockLostError, "com.microsoft:message-lock-lost", 410),
    (ex.SessionLockLostError, "com.microsoft:session-lock-lost", 410),
    (ex.SessionCannotBeLockedError, "com.microsoft:session-cannot-be-locked", 410),
    (ex.OperationTimeoutError, "com.microsoft:timeout", 408),
    (ex.ServiceBusServerBusyError, "com.microsoft:server-busy", 503),
    (ex.MessageAlreadySettled, "com.microsoft:message-lock-lost", 410),
    (ex.InvalidArgumentError, "com.microsoft:argument-error", 400),
    (ex.FilterSyntaxError, "com.microsoft:argument-error", 400),  # a rule's SQL
    (DecodeError, "amqp:decode-error", 400),
    (TypeError, "com.microsoft:argument-error", 400),  # a request field of the wrong type
)


def _lookup(error: BaseException) -> tuple[str, int]:
    for cls, condition, status in _CONDITIONS:
        if isinstance(error, cls):
            return condition, status
    return "amqp:internal-error", 500


def condition_of(error: BaseException) -> str:
    """The AMQP error condition for ``error`` (``amqp:internal-error`` if unknown)."""
    return _lookup(error)[0]


def status_of(error: BaseException) -> int:
    """The ``$management`` statusCode for ``error``."""
    return _lookup(error)[1]
