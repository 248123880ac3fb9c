"""The two ways durable storage fails: it is unreachable for now, or its data is damaged.

Both subclass ``raybus.exceptions.ServiceBusError`` and follow its conventions: positional
constructor arguments kept in ``self.args`` (so they pickle across actor boundaries unchanged),
structured fields, and a class-level ``retryable``.
"""

from __future__ import annotations

from ..exceptions import ServiceBusError

__all__ = ["StorageCorruptedError", "StorageUnavailableError"]


class StorageUnavailableError(ServiceBusError):
    """Durable storage refused a read or write (disk full, I/O error, permission, network).

    ``path`` is the file or directory involved, ``errno`` the OS error number when there is one
    (``errno.ENOSPC``, ``errno.EIO``, ...; ``None`` for errors without one, e.g. from an object
    store). The operation that raised did not become durable and was not acknowledged: nothing
    it wrote will be returned by a later recovery in its place (see ``DurableLog.append`` for the
    exact guarantee). Retry after a back-off once space or access is restored.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        path: str | None = None,
        errno: int | None = None,
        entity: str | None = None,
    ) -> None:
        super().__init__(message, entity)
        # The base class stores (message, entity); keep our own constructor's order instead so
        # ``ServiceBusError.__reduce__`` rebuilds this class from ``self.args``.
        self.args = (message, path, errno, entity)
        self.path = path
        self.errno = errno


class StorageCorruptedError(ServiceBusError):
    """A stored file that acknowledged data depends on is damaged or missing.

    ``path`` names the file (or the gap where one is missing), ``reason`` says what is wrong
    (bad checksum, bad length, missing log file). Recovery refuses to continue rather than
    silently drop acknowledged messages. Retrying fails again: restore the directory from a
    backup, or, accepting the loss, have an operator move the damaged files away.
    """

    retryable = False

    def __init__(self, path: str, reason: str, entity: str | None = None) -> None:
        super().__init__(f"storage file {path} is corrupted: {reason}", entity)
        self.args = (path, reason, entity)
        self.path = path
        self.reason = reason
