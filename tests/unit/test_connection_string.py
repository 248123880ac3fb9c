"""Service Bus connection strings read by ``raybus.auth.parse_connection_string`` (the forms the
Azure SDKs and the portal write; a typed error naming ``conn_str`` for the malformed), and the
azure-core credentials ``raybus.auth.as_credential`` takes."""

from __future__ import annotations

from typing import Any

import pytest

from raybus.auth import (
    NamedKeyCredential,
    SasTokenCredential,
    SharedAccessKeyCredential,
    SignatureCredential,
    as_credential,
    client_namespace,
    generate_sas_token,
    parse_connection_string,
    parse_sas_token,
)
from raybus.exceptions import InvalidArgumentError, ServiceBusAuthenticationError


def test_the_portals_form_gives_the_namespace_and_a_key_credential() -> None:
    got = parse_connection_string(
        "Endpoint=sb://orders.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=abc+def/ghi=="
    )
    assert got.namespace == "orders" and got.entity_path is None
    assert isinstance(got.credential, SharedAccessKeyCredential)
    assert got.credential.key_name == "RootManageSharedAccessKey"
    assert got.credential._key == "abc+def/ghi=="  # a key's own '=' padding is kept


def test_keys_in_any_case_an_entity_path_and_unknown_keys() -> None:
    got = parse_connection_string(
        "endpoint=sb://Billing.servicebus.windows.net;sharedaccesskeyname=send;"
        "SHAREDACCESSKEY=k;EntityPath=invoices;UseDevelopmentEmulator=true;"
    )
    assert got.namespace == "billing" and got.entity_path == "invoices"
    assert isinstance(got.credential, SharedAccessKeyCredential)


def test_a_signature_and_no_credential_at_all() -> None:
    token = generate_sas_token("sb://ns/q", "send", "key", 2_000_000_000)
    got = parse_connection_string(f"Endpoint=sb://ns:5672/;SharedAccessSignature={token}")
    assert got.namespace == "ns" and isinstance(got.credential, SasTokenCredential)
    assert got.credential.token == token
    assert parse_connection_string("Endpoint=sb://localhost:5672").credential is None
    assert parse_connection_string("Endpoint=dev.example;").namespace == "dev"  # no scheme


@pytest.mark.parametrize(
    ("conn_str", "why"),
    [
        ("", "is blank"),
        ("   ", "is blank"),
        (None, "is blank"),
        ("SharedAccessKeyName=a;SharedAccessKey=b", "has no Endpoint"),
        ("Endpoint=sb://ns/;justtext", "'justtext' is not key=value"),
        ("Endpoint=sb:///;SharedAccessKeyName=a;SharedAccessKey=b", "without a host name"),
        ("Endpoint=sb://ns/;SharedAccessKeyName=a", "needs both"),
        ("Endpoint=sb://ns/;SharedAccessKey=b", "needs both"),
        (
            "Endpoint=sb://ns/;SharedAccessKeyName=a;SharedAccessKey=b;SharedAccessSignature=s",
            "both a SharedAccessKey and a SharedAccessSignature",
        ),
    ],
)
def test_a_malformed_string_is_a_typed_error_naming_it(conn_str: Any, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=why) as err:
        parse_connection_string(conn_str)
    assert err.value.argument == "conn_str"


def test_a_malformed_signature_is_refused_as_a_token() -> None:
    with pytest.raises(ServiceBusAuthenticationError, match="not a SharedAccessSignature"):
        parse_connection_string("Endpoint=sb://ns/;SharedAccessSignature=nonsense")


def test_azure_cores_key_and_sas_credentials_are_taken_and_their_updates_followed() -> None:
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    named = AzureNamedKeyCredential("root", "key-1")
    cred = as_credential(named)
    assert isinstance(cred, NamedKeyCredential)
    first = parse_sas_token(cred.token_for("/q"))
    assert first.key_name == "root" and first.signed_by("key-1")
    named.update("root", "key-2")  # a rotated key signs the next token
    assert parse_sas_token(cred.token_for("/q")).signed_by("key-2")

    token = generate_sas_token("sb://ns/q", "send", "k", 2_000_000_000)
    sas = AzureSasCredential(token)
    wrapped = as_credential(sas)
    assert isinstance(wrapped, SignatureCredential) and wrapped.token_for("/q") == token
    newer = generate_sas_token("sb://ns/q", "send", "k", 2_000_000_001)
    sas.update(newer)
    assert wrapped.token_for("/q") == newer

    own = SharedAccessKeyCredential("a", "b")
    assert as_credential(own) is own and as_credential(None) is None


def test_credentials_raybus_cannot_use_are_typed_errors() -> None:
    class AzureAd:
        def get_token(self, *scopes: str) -> Any:
            raise AssertionError("never asked")

    with pytest.raises(InvalidArgumentError, match="Azure AD credentials") as err:
        as_credential(AzureAd())
    assert err.value.argument == "credential"
    with pytest.raises(InvalidArgumentError, match="not str") as err:
        as_credential("my-key")
    assert err.value.argument == "credential"
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    with pytest.raises(InvalidArgumentError):
        as_credential(AzureNamedKeyCredential("", "key"))
    with pytest.raises(ServiceBusAuthenticationError):
        as_credential(AzureSasCredential("not a token"))
    # The class instead of an instance (``credential = AzureNamedKeyCredential``) is refused
    # here, not at the first call.
    for cls in (AzureNamedKeyCredential, AzureSasCredential, SharedAccessKeyCredential):
        with pytest.raises(InvalidArgumentError, match="not the class") as err:
            as_credential(cls)
        assert err.value.argument == "credential"


@pytest.mark.parametrize(
    ("namespace", "fqn", "expected"),
    [
        (None, None, "default"),
        ("shop", None, "shop"),
        ("orders.servicebus.windows.net", None, "orders"),
        ("sb://orders.servicebus.windows.net/", None, "orders"),
        (None, "billing.servicebus.windows.net", "billing"),
        ("bad name!", None, "bad name!"),  # left for the client's own check
    ],
)
def test_a_client_takes_a_namespace_or_the_sdks_host_name(
    namespace: str | None, fqn: str | None, expected: str
) -> None:
    assert client_namespace(namespace, fqn) == expected


def test_a_namespace_and_a_host_name_together_are_refused() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        client_namespace("a", "b.servicebus.windows.net")
    assert err.value.argument == "fully_qualified_namespace"


@pytest.mark.parametrize("option", ["credential", "namespace", "fully_qualified_namespace"])
def test_an_option_the_string_already_sets_is_a_typed_error(option: str) -> None:
    with pytest.raises(InvalidArgumentError, match="comes from the connection string") as err:
        parse_connection_string("Endpoint=sb://ns/", {option: None, "retry_total": 1})
    assert err.value.argument == option
    assert parse_connection_string("Endpoint=sb://ns/", {"retry_total": 1}).namespace == "ns"


def test_every_client_refuses_a_credential_beside_its_connection_string() -> None:
    """Checked before anything connects (no Ray here)."""
    import raybus
    import raybus.aio
    import raybus.management

    key = SharedAccessKeyCredential("a", "b")
    for make in (
        raybus.ServiceBusClient.from_connection_string,
        raybus.aio.ServiceBusClient.from_connection_string,
        raybus.management.ServiceBusAdministrationClient.from_connection_string,
        raybus.aio.ServiceBusAdministrationClient.from_connection_string,
    ):
        with pytest.raises(InvalidArgumentError) as err:
            make("Endpoint=sb://ns/;SharedAccessKeyName=a;SharedAccessKey=b", credential=key)
        assert err.value.argument == "credential"


def test_a_get_token_credential_of_sas_tokens_is_taken_as_the_sdk_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's sample ``CustomizedSASCredential``: ``get_token`` hands out SAS tokens and
    ``token_type`` says so. raybus asks it per entity, keeps a token until a quarter of its
    life is left, and refuses one that is not a SAS token; a JWT source stays refused."""
    import time as clock

    from azure.core.credentials import AccessToken

    import raybus.auth as auth

    now = [1_000_000.0]
    monkeypatch.setattr(auth.time, "time", lambda: now[0])
    asked: list[str] = []

    class SasSource:
        token_type = b"servicebus.windows.net:sastoken"

        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            asked.append(scopes[0])
            expiry = int(now[0]) + 400
            return AccessToken(generate_sas_token(scopes[0], "send", "k", expiry), expiry)

    wrapped = as_credential(SasSource())
    assert isinstance(wrapped, auth.SasTokenSourceCredential)
    first = wrapped.token_for("/q")
    assert asked == ["sb://raybus/q"] and parse_sas_token(first).path == "/q"
    now[0] += 250  # 150 s of 400 left: still more than a quarter
    assert wrapped.token_for("/q") == first and len(asked) == 1
    now[0] += 60  # 90 s left: asked again
    assert wrapped.token_for("/q") != first and len(asked) == 2
    wrapped.token_for("/t")
    assert asked[-1] == "sb://raybus/t"

    class NotSas(SasSource):
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken("eyJ-a-jwt", int(clock.time()) + 3600)

    with pytest.raises(ServiceBusAuthenticationError):
        as_credential(NotSas()).token_for("/q")  # type: ignore[union-attr]

    class AsyncSource:
        token_type = "servicebus.windows.net:sastoken"

        async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            raise AssertionError("never asked")

    with pytest.raises(InvalidArgumentError, match="asynchronous"):
        as_credential(AsyncSource())

    class Jwt(SasSource):
        token_type = b"jwt"

    with pytest.raises(InvalidArgumentError, match="Azure AD"):
        as_credential(Jwt())
