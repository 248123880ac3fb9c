"""Access control: Service Bus shared-access keys, SAS tokens and the credentials clients present.

The model is Service Bus's (``service-bus-semantics.md``, shared access signatures):

* An **authorization rule** is a named pair of keys (primary, secondary) with a set of rights:
  ``Send``, ``Listen``, ``Manage`` (``Manage`` implies the other two). Rules belong to the
  namespace (they cover every entity) or to one queue or topic (they cover that entity and, for
  a topic, its subscriptions; a subscription has no rules of its own, as in Service Bus).
* A **SAS token** is ``SharedAccessSignature sr=<resource>&sig=<signature>&se=<expiry>&skn=<rule>``
  where ``signature = base64(HMAC-SHA256(key, quote_plus(resource) + "\\n" + expiry))`` — the same
  bytes the Azure SDKs compute, so tokens they make verify here and the other way round. Either of
  the rule's two keys may sign, which is how keys rotate without downtime: clients move to the
  secondary, the primary is regenerated, clients move back.
* The token grants the rule's rights on ``resource`` and everything below it. raybus compares
  only the resource's *path* (``/orders``, ``/t/subscriptions/s``; ``/`` for the whole
  namespace), case-insensitively and on segment boundaries: host names differ between the Ray
  client, the AMQP gateway and the HTTP gateway, but the entity names do not.

A namespace without rules is **open** (no token needed): that keeps a laptop's first run
working. Adding the first rule closes it. The checks run inside the actors (``Guard`` in
``raybus._core.access``); this module holds the pure pieces a client needs.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import inspect
import secrets
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .exceptions import InvalidArgumentError, ServiceBusAuthenticationError

__all__ = [
    "AccessRights",
    "AuthorizationRule",
    "ConnectionString",
    "Credential",
    "CredentialLike",
    "NamedKeyCredential",
    "SasToken",
    "SasTokenCredential",
    "SasTokenSourceCredential",
    "SharedAccessKeyCredential",
    "SignatureCredential",
    "as_credential",
    "client_namespace",
    "generate_key",
    "generate_sas_token",
    "parse_connection_string",
    "parse_sas_token",
    "resource_path",
]

# A token lives an hour by default, as the Azure SDKs' do.
DEFAULT_TOKEN_TTL_S = 3600
_KEY_BYTES = 32  # Service Bus keys are 256-bit, base64-encoded


class AccessRights(str, enum.Enum):
    """What a rule's keys allow (``Manage`` implies ``Send`` and ``Listen``)."""

    SEND = "Send"
    LISTEN = "Listen"
    MANAGE = "Manage"


def normalise_rights(rights: Iterable[AccessRights | str]) -> frozenset[AccessRights]:
    """``rights`` as a set, with ``Manage`` expanded; bad names raise ``InvalidArgumentError``."""
    out: set[AccessRights] = set()
    for r in rights:
        try:
            # The SDK's AccessRights (a str enum of the same values) by its value.
            name = str(getattr(r, "value", r))
            out.add(r if isinstance(r, AccessRights) else AccessRights(name.capitalize()))
        except ValueError:
            raise InvalidArgumentError(
                f"unknown access right {r!r}: use Send, Listen or Manage", None, "rights"
            ) from None
    if not out:
        raise InvalidArgumentError("a rule needs at least one right", None, "rights")
    if AccessRights.MANAGE in out:
        out |= {AccessRights.SEND, AccessRights.LISTEN}
    return frozenset(out)


def generate_key() -> str:
    """A new random key, base64 like Service Bus's."""
    return base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode("ascii")


@dataclass(frozen=True)
class AuthorizationRule:
    """A named key pair with rights; ``entity`` is None for a namespace-wide rule.

    Also the SDK's ``azure.servicebus.management.AuthorizationRule`` (exported from
    ``raybus.management``): built by keywords (``AuthorizationRule(key_name="reader",
    rights=[AccessRights.LISTEN])``; keys are generated unless given; rights may be the SDK's
    enum or their names), passed in a queue's or topic's ``authorization_rules``, with the
    SDK's ``claim_type``, ``claim_value``, ``created_at_utc`` and ``modified_at_utc`` (set by
    the namespace when it stores the rule).
    """

    key_name: str
    rights: frozenset[AccessRights]
    primary_key: str = field(default_factory=generate_key, repr=False)
    secondary_key: str = field(default_factory=generate_key, repr=False)
    entity: str | None = None
    claim_type: str = "SharedAccessKey"
    claim_value: str = "None"
    created_at_utc: datetime | None = None
    modified_at_utc: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rights, frozenset) or not all(
            isinstance(r, AccessRights) for r in self.rights
        ):
            object.__setattr__(self, "rights", normalise_rights(self.rights))

    def keys(self) -> tuple[str, str]:
        return (self.primary_key, self.secondary_key)


def resource_path(resource: str) -> str:
    """The lower-cased path of a resource URI: ``sb://host:5671/Orders/`` -> ``/orders``;
    ``orders`` -> ``/orders``; the namespace itself is ``/``."""
    parsed = urllib.parse.urlsplit(resource)
    path = parsed.path if parsed.scheme or parsed.netloc else resource
    parts = [p for p in urllib.parse.unquote(path).lower().split("/") if p]
    return "/" + "/".join(parts)


def covers(scope: str, path: str) -> bool:
    """Whether a grant on ``scope`` reaches ``path`` (both from ``resource_path``)."""
    return scope == "/" or path == scope or path.startswith(scope + "/")


def _sign(key: str, resource: str, expiry: int) -> str:
    message = f"{urllib.parse.quote_plus(resource)}\n{expiry}".encode()
    digest = hmac.new(key.encode("utf-8"), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def generate_sas_token(
    resource: str, key_name: str, key: str, expiry: int | None = None, *, ttl: float | None = None
) -> str:
    """A Service Bus SAS token for ``resource`` signed with ``key``; valid until ``expiry``
    (Unix seconds) or for ``ttl`` seconds from now (default an hour)."""
    if expiry is None:
        expiry = int(time.time() + (DEFAULT_TOKEN_TTL_S if ttl is None else ttl))
    sig = _sign(key, resource, expiry)
    return "SharedAccessSignature " + "&".join(
        [
            f"sr={urllib.parse.quote_plus(resource)}",
            f"sig={urllib.parse.quote_plus(sig)}",
            f"se={expiry}",
            f"skn={urllib.parse.quote_plus(key_name)}",
        ]
    )


@dataclass(frozen=True)
class SasToken:
    """A parsed SAS token (not yet verified)."""

    resource: str
    signature: str
    expiry: int
    key_name: str

    @property
    def path(self) -> str:
        return resource_path(self.resource)

    def signed_by(self, key: str) -> bool:
        return hmac.compare_digest(_sign(key, self.resource, self.expiry), self.signature)


def parse_sas_token(token: str) -> SasToken:
    """Split a ``SharedAccessSignature sr=..&sig=..&se=..&skn=..`` token; a malformed one raises
    ``ServiceBusAuthenticationError`` naming what is missing."""
    if not isinstance(token, str) or not token.startswith("SharedAccessSignature "):
        raise ServiceBusAuthenticationError("the token is not a SharedAccessSignature token", None)
    fields = dict(urllib.parse.parse_qsl(token[len("SharedAccessSignature ") :].strip()))
    missing = [k for k in ("sr", "sig", "se", "skn") if not fields.get(k)]
    if missing:
        raise ServiceBusAuthenticationError(f"the SAS token lacks {', '.join(missing)}", None)
    try:
        expiry = int(fields["se"])
    except ValueError:
        raise ServiceBusAuthenticationError(
            f"the SAS token's expiry se={fields['se']!r} is not a number", None
        ) from None
    return SasToken(fields["sr"], fields["sig"], expiry, fields["skn"])


class SasTokenCredential:
    """A ready-made SAS token (e.g. handed out by whoever holds the key). It is presented as is
    for every entity, so its resource must cover every entity this client uses."""

    def __init__(self, token: str) -> None:
        parse_sas_token(token)  # fail early on a malformed one
        self.token = token

    def token_for(self, path: str) -> str:
        return self.token


class SharedAccessKeyCredential:
    """A rule's name and key: the client signs a token per entity (``ttl`` seconds each) and
    renews it before it expires. Works for namespace-wide and entity rules alike."""

    def __init__(self, key_name: str, key: str, *, ttl: float = DEFAULT_TOKEN_TTL_S) -> None:
        if not isinstance(key_name, str) or not key_name or not isinstance(key, str) or not key:
            raise InvalidArgumentError("key_name and key must be non-empty strings", None, "key")
        self.key_name = key_name
        self._key = key
        self._ttl = ttl
        self._tokens: dict[str, tuple[float, str]] = {}

    def token_for(self, path: str) -> str:
        now = time.time()
        cached = self._tokens.get(path)
        if cached is not None and cached[0] - now > self._ttl / 4:
            return cached[1]
        expiry = int(now + self._ttl)
        token = generate_sas_token(f"sb://raybus{path}", self.key_name, self._key, expiry)
        self._tokens[path] = (float(expiry), token)
        return token


class _NamedKey(Protocol):
    """azure-core's ``AzureNamedKeyCredential``: ``named_key`` is (name, key)."""

    @property
    def named_key(self) -> tuple[str, str]: ...


class _Signature(Protocol):
    """azure-core's ``AzureSasCredential``: ``signature`` is a SAS token."""

    @property
    def signature(self) -> str: ...


class NamedKeyCredential:
    """An azure-core ``AzureNamedKeyCredential`` (anything with ``named_key``) as a raybus
    credential: the key is read at each signing, so its ``update()`` (a rotated key) is used
    from the next token on."""

    def __init__(self, source: _NamedKey, *, ttl: float = DEFAULT_TOKEN_TTL_S) -> None:
        self._source = source
        self._ttl = ttl
        self._signer: SharedAccessKeyCredential | None = None
        self._signed_with: tuple[str, str] | None = None
        self.token_for("/")  # fail early on an empty name or key

    def token_for(self, path: str) -> str:
        name, key = self._source.named_key
        if self._signer is None or self._signed_with != (name, key):
            self._signer = SharedAccessKeyCredential(name, key, ttl=self._ttl)
            self._signed_with = (name, key)
        return self._signer.token_for(path)


class SignatureCredential:
    """An azure-core ``AzureSasCredential`` (anything with ``signature``) as a raybus
    credential: its token is presented as is, read at each call (``update()`` takes effect)."""

    def __init__(self, source: _Signature) -> None:
        parse_sas_token(source.signature)  # fail early on a malformed one
        self._source = source

    def token_for(self, path: str) -> str:
        return self._source.signature


# The ``token_type`` of a ``get_token`` credential whose tokens are SAS tokens (azure-servicebus's
# ``TOKEN_TYPE_SASTOKEN``); any other (``b"jwt"``, or none) is an Azure AD credential.
SAS_TOKEN_TYPE = "servicebus.windows.net:sastoken"


class _TokenSource(Protocol):
    """A ``get_token`` credential (azure-core's ``TokenCredential`` shape)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


def is_sas_token_source(value: object) -> bool:
    """Whether ``value`` is a ``get_token`` credential that hands out SAS tokens."""
    kind = getattr(value, "token_type", None)
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    return hasattr(value, "get_token") and kind == SAS_TOKEN_TYPE


class SasTokenSourceCredential:
    """A ``get_token`` credential whose ``token_type`` is the SAS one, as the SDK takes it (its
    sample ``CustomizedSASCredential``): raybus asks it for a token per entity (the scope
    ``sb://raybus/<path>``; hosts are not compared) and presents that token until a quarter of
    its life is left (``expires_on`` of the azure-core ``AccessToken`` it returns), then asks
    again. A token that is not a SAS token is refused as a malformed token is."""

    def __init__(self, source: _TokenSource) -> None:
        if inspect.iscoroutinefunction(source.get_token):
            raise InvalidArgumentError(
                "an asynchronous get_token credential is not supported: give raybus one whose "
                "get_token is synchronous (or an AzureSasCredential)",
                None,
                "credential",
            )
        self._source = source
        self._tokens: dict[str, tuple[float, float, str]] = {}  # path -> (got, expires, token)

    def token_for(self, path: str) -> str:
        now = time.time()
        cached = self._tokens.get(path)
        if cached is not None:
            got, expires, token = cached
            if expires - now > (expires - got) / 4:
                return token
        answer = self._source.get_token(f"sb://raybus{path}")
        token, expires = str(answer.token), float(answer.expires_on)
        parse_sas_token(token)  # a malformed one: ServiceBusAuthenticationError
        self._tokens[path] = (now, expires, token)
        return token


Credential = (
    SasTokenCredential
    | SharedAccessKeyCredential
    | NamedKeyCredential
    | SignatureCredential
    | SasTokenSourceCredential
)
_OURS = (
    SasTokenCredential,
    SharedAccessKeyCredential,
    NamedKeyCredential,
    SignatureCredential,
    SasTokenSourceCredential,
)
# What the clients' ``credential=`` takes: raybus's credentials or azure-core's key and SAS ones.
CredentialLike = Credential | _NamedKey | _Signature | _TokenSource


def as_credential(value: object) -> Credential | None:
    """The raybus credential for a client's ``credential=``: raybus's own as they are,
    azure-core's ``AzureNamedKeyCredential`` and ``AzureSasCredential`` wrapped, and a
    ``get_token`` credential whose ``token_type`` is the SAS one (``SasTokenSourceCredential``).
    Anything else is an ``InvalidArgumentError``; an Azure AD ``TokenCredential``
    (``get_token`` of JWTs) says that raybus authorizes with shared-access keys and SAS tokens
    only."""
    if value is None or isinstance(value, _OURS):
        return value
    if isinstance(value, type):  # ``credential=AzureNamedKeyCredential``: the class itself
        raise InvalidArgumentError(
            f"credential must be a credential object, not the class {value.__name__} "
            "(call it with the key's name and value)",
            None,
            "credential",
        )
    if hasattr(value, "named_key"):
        return NamedKeyCredential(value)
    if hasattr(value, "signature"):
        return SignatureCredential(value)
    if is_sas_token_source(value):
        return SasTokenSourceCredential(value)  # type: ignore[arg-type]
    if hasattr(value, "get_token"):
        raise InvalidArgumentError(
            "Azure AD credentials (get_token) are not supported: raybus authorizes with "
            "shared-access keys and SAS tokens (AzureNamedKeyCredential, AzureSasCredential, "
            f"a get_token credential whose token_type is {SAS_TOKEN_TYPE!r}, or raybus.auth's "
            "SharedAccessKeyCredential and SasTokenCredential)",
            None,
            "credential",
        )
    raise InvalidArgumentError(
        f"credential must be a shared-access key or SAS credential, not {type(value).__name__}",
        None,
        "credential",
    )


@dataclass(frozen=True)
class ConnectionString:
    """What a Service Bus connection string says to a raybus client: the namespace (the
    endpoint's first host label: ``sb://orders.servicebus.windows.net/`` is ``orders``), the
    credential (None: no key, for an open namespace) and ``EntityPath`` (None if absent)."""

    namespace: str
    credential: Credential | None
    entity_path: str | None
    host: str = ""  # the endpoint's host name: the SDK's fully_qualified_namespace


def _bad_connection_string(why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"the connection string {why}", None, "conn_str")


def _connection_fields(conn_str: str) -> dict[str, str]:
    """A connection string's ``key=value`` fields, keys in lower case (a blank or malformed
    string is an ``InvalidArgumentError`` naming ``conn_str``)."""
    if not isinstance(conn_str, str) or not conn_str.strip():
        raise _bad_connection_string("is blank")
    fields: dict[str, str] = {}
    for element in conn_str.strip().split(";"):
        if not element.strip():
            continue
        field_name, sep, value = element.partition("=")
        if not sep or not field_name.strip():
            raise _bad_connection_string(f"is malformed: {element.strip()!r} is not key=value")
        fields[field_name.strip().lower()] = value.strip()
    return fields


def parse_connection_string(conn_str: str, options: Iterable[str] = ()) -> ConnectionString:
    """Read ``Endpoint=sb://<host>/;SharedAccessKeyName=..;SharedAccessKey=..`` (or
    ``SharedAccessSignature=<token>``; ``EntityPath=..``), as the Azure SDKs do: keys in any
    case, unknown keys (``UseDevelopmentEmulator``) ignored. A blank or malformed string, a key
    name without its key (or the other way round), or a key and a signature together raise
    ``InvalidArgumentError`` naming ``conn_str``; nothing is connected. ``options`` are the
    names of the client options passed beside the string: one that the string sets (the
    namespace, the credential) is an ``InvalidArgumentError`` naming it."""
    for option in ("namespace", "fully_qualified_namespace", "credential"):
        if option in options:
            raise InvalidArgumentError(
                f"{option} comes from the connection string; do not pass it as well",
                None,
                option,
            )
    props, credential = _read_connection_string(conn_str)
    host = props.fully_qualified_namespace
    return ConnectionString(_first_label(host), credential, props.entity_path, host)


@dataclass(frozen=True)
class ServiceBusConnectionStringProperties:
    """A connection string's parts, as azure-servicebus's ``parse_connection_string`` gives
    them (``raybus.parse_connection_string``)."""

    fully_qualified_namespace: str
    endpoint: str
    entity_path: str | None = None
    shared_access_key_name: str | None = None
    shared_access_key: str | None = None
    shared_access_signature: str | None = None


def connection_string_properties(conn_str: str) -> ServiceBusConnectionStringProperties:
    """The SDK's ``parse_connection_string``: the parts of ``conn_str``, checked as a client
    checks them (``parse_connection_string``: a malformed string is an
    ``InvalidArgumentError`` naming ``conn_str``)."""
    return _read_connection_string(conn_str)[0]


def _read_connection_string(
    conn_str: str,
) -> tuple[ServiceBusConnectionStringProperties, Credential | None]:
    """The checked parts of a connection string, and the credential its key or signature
    makes (None without either)."""
    fields = _connection_fields(conn_str)
    endpoint = fields.get("endpoint")
    if not endpoint:
        raise _bad_connection_string("has no Endpoint")
    host = _endpoint_host(endpoint)
    if not host or not _first_label(host):
        raise _bad_connection_string(f"has an Endpoint without a host name: {endpoint!r}")
    name, key = fields.get("sharedaccesskeyname"), fields.get("sharedaccesskey")
    signature = fields.get("sharedaccesssignature")
    if signature and (name or key):
        raise _bad_connection_string(
            "has both a SharedAccessKey and a SharedAccessSignature: give one"
        )
    if bool(name) != bool(key):
        raise _bad_connection_string(
            "needs both SharedAccessKeyName and SharedAccessKey, or neither"
        )
    credential: Credential | None = None
    if signature:
        credential = SasTokenCredential(signature)
    elif name and key:
        credential = SharedAccessKeyCredential(name, key)
    props = ServiceBusConnectionStringProperties(
        fully_qualified_namespace=host,
        endpoint=endpoint,
        entity_path=fields.get("entitypath") or None,
        shared_access_key_name=name or None,
        shared_access_key=key or None,
        shared_access_signature=signature or None,
    )
    return props, credential


def _endpoint_host(endpoint: str) -> str | None:
    """An endpoint's host name (``sb://orders.servicebus.windows.net/`` and
    ``orders.servicebus.windows.net`` both give ``orders.servicebus.windows.net``)."""
    return urllib.parse.urlsplit(endpoint if "//" in endpoint else f"sb://{endpoint}").hostname


def _first_label(host: str) -> str:
    """A host name's first label (``orders`` of ``orders.servicebus.windows.net``): the
    namespace a host names."""
    return host.split(".")[0]


def client_namespace(namespace: str | None, fully_qualified_namespace: str | None = None) -> str:
    """The raybus namespace a client is made for: ``namespace`` (default ``"default"``), or the
    SDK's ``fully_qualified_namespace=``. A host name (``orders.servicebus.windows.net``, as
    code written for azure-servicebus passes it) names the namespace of its first label, as a
    connection string's endpoint does. Anything else is left for the client to check."""
    if namespace is not None and fully_qualified_namespace is not None:
        raise InvalidArgumentError(
            "give the namespace or fully_qualified_namespace, not both",
            None,
            "fully_qualified_namespace",
        )
    name = namespace if namespace is not None else fully_qualified_namespace
    if name is None:
        return "default"
    if isinstance(name, str) and ("." in name or "://" in name):
        host = _endpoint_host(name)
        return (host and _first_label(host)) or name
    return name
