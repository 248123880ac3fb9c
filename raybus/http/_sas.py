"""The gateway's side of access control: the ``Authorization`` header (one client per token:
``raybus._client_cache``).

The gateway checks only what it can check without the namespace's keys: that the header is a
well-formed ``SharedAccessSignature`` token that has not expired. Whether the signature is good
and the rule's rights cover the request is decided by the broker's actors, which see the token
through a client created with ``credential=SasTokenCredential(token)`` — the same path a Python
client takes, so HTTP and Python callers are held to the same rules.

A request without the header runs with no credential: that is allowed exactly when the
namespace has no authorization rules (an open namespace); otherwise the broker answers
``ServiceBusAuthenticationError`` and the gateway 401.
"""

from __future__ import annotations

import time

from ..auth import parse_sas_token
from ..exceptions import ServiceBusAuthenticationError

__all__ = ["credential_from_header"]

# A header longer than this is not a token (real ones are ~200-400 characters).
MAX_AUTHORIZATION_LENGTH = 4096


def credential_from_header(header: str | None, *, now: float | None = None) -> str | None:
    """The SAS token of an ``Authorization`` header, or None when there is no header.

    Raises ``ServiceBusAuthenticationError`` (the gateway's 401) for a header that is not a
    ``SharedAccessSignature`` token, lacks a field, or has expired.
    """
    if header is None or not header.strip():
        return None
    token = header.strip()
    if len(token) > MAX_AUTHORIZATION_LENGTH:
        raise ServiceBusAuthenticationError("the Authorization header is too long", None)
    parsed = parse_sas_token(token)
    if parsed.expiry <= (time.time() if now is None else now):
        raise ServiceBusAuthenticationError(
            f"the SAS token expired at {parsed.expiry} (Unix seconds)", None
        )
    return token
