"""What a receiver raises when the broker refused settlements it had sent without waiting.

Most refusals are about the message: its lock was lost (an actor restart, a lock that ran out),
so it will be delivered again — ``SettlementFailedError`` (a ``MessageLockLostError``) lists
them. Some are about the caller or the entity instead: a token without ``Listen`` or an
expired one, an entity deleted or disabled meanwhile. Reporting those as lost locks would be
wrong (the locks are still valid, and retrying the same way fails again), so the broker's own
error is raised as it is.
"""

from __future__ import annotations

from ..exceptions import (
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    SettlementFailedError,
)

__all__ = ["Failure", "refusal"]

# (sequence number, lock token, the broker's error or a description)
Failure = tuple[int | None, str | None, BaseException | str]

_NOT_ABOUT_THE_MESSAGE = (
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    MessagingEntityNotFoundError,
    MessagingEntityDisabledError,
)


def refusal(message: str, entity: str, failures: list[Failure]) -> Exception:
    """The exception for ``failures`` (see the module docstring)."""
    for _seq, _token, error in failures:
        if isinstance(error, _NOT_ABOUT_THE_MESSAGE):
            return error
    return SettlementFailedError(
        message, entity, [(seq, token, str(error)) for seq, token, error in failures]
    )
