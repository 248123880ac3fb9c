"""Access control without Ray: SAS tokens as Azure computes them, the actors' Guard, and the
client's ``AuthedHandle``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import pickle
import urllib.parse

import pytest

from raybus._actors.access import AuthedHandle
from raybus._connection import Connection
from raybus._core.access import ANY, INTERNAL, AccessTable, Guard
from raybus.auth import (
    AccessRights,
    SasTokenCredential,
    SharedAccessKeyCredential,
    covers,
    generate_sas_token,
    parse_sas_token,
    resource_path,
)
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

SEND, LISTEN, MANAGE = AccessRights.SEND, AccessRights.LISTEN, AccessRights.MANAGE
INTERNAL_TOKEN = "RaybusInternal s3cret"


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def azure_token(uri: str, name: str, key: str, expiry: int) -> str:
    """Written from Microsoft's documented recipe, independently of raybus.auth."""
    to_sign = urllib.parse.quote_plus(uri) + "\n" + str(expiry)
    sig = base64.b64encode(hmac.new(key.encode(), to_sign.encode(), hashlib.sha256).digest())
    return "SharedAccessSignature sr={}&sig={}&se={}&skn={}".format(
        urllib.parse.quote_plus(uri), urllib.parse.quote(sig.decode(), safe=""), expiry, name
    )


def guard_with(*rules: tuple[str, list[str], str | None, str, str]) -> tuple[Guard, FakeClock]:
    clock = FakeClock()
    guard = Guard(INTERNAL_TOKEN, clock)
    table = AccessTable()
    for name, rights, entity, primary, secondary in rules:
        table.put(table.validate(name, rights, entity, primary, secondary))
    guard.load(*table.snapshot())
    return guard, clock


KEY_A = "A" * 32
KEY_B = "B" * 32


def test_a_token_made_by_the_documented_recipe_verifies_and_ours_matches_it() -> None:
    ours = generate_sas_token("sb://localhost/orders", "send", KEY_A, 2_000_000)
    theirs = azure_token("sb://localhost/orders", "send", KEY_A, 2_000_000)
    assert parse_sas_token(ours) == parse_sas_token(theirs)
    guard, _ = guard_with(("send", ["Send"], None, KEY_A, KEY_B))
    guard.check(theirs, SEND, "orders")


@pytest.mark.parametrize(
    "token, fragment",
    [
        ("Bearer abc", "not a SharedAccessSignature"),
        ("SharedAccessSignature sr=x&sig=y&skn=k", "lacks se"),
        ("SharedAccessSignature sr=x&sig=y&se=soon&skn=k", "not a number"),
    ],
)
def test_malformed_tokens_are_authentication_errors(token: str, fragment: str) -> None:
    guard, _ = guard_with(("k", ["Send"], None, KEY_A, KEY_B))
    with pytest.raises(ServiceBusAuthenticationError, match=fragment):
        guard.check(token, SEND, "q")


def test_an_open_guard_passes_everything_and_a_closed_one_needs_a_token() -> None:
    guard = Guard(INTERNAL_TOKEN, FakeClock())
    guard.check(None, MANAGE, "q")
    guard.check(None, INTERNAL, "q")
    closed, _ = guard_with(("k", ["Send"], None, KEY_A, KEY_B))
    with pytest.raises(ServiceBusAuthenticationError, match="requires a SAS token"):
        closed.check(None, SEND, "q")


def test_rights_are_checked_and_manage_implies_send_and_listen() -> None:
    guard, clock = guard_with(
        ("send", ["Send"], None, KEY_A, KEY_B), ("admin", ["Manage"], None, KEY_B, KEY_A)
    )
    send = generate_sas_token("sb://x/", "send", KEY_A, int(clock.t + 60))
    admin = generate_sas_token("sb://x/", "admin", KEY_B, int(clock.t + 60))
    guard.check(send, SEND, "q")
    guard.check(send, ANY, "q")
    with pytest.raises(ServiceBusAuthorizationError, match="not Listen"):
        guard.check(send, LISTEN, "q")
    for right in (SEND, LISTEN, MANAGE):
        guard.check(admin, right, "q")


def test_the_token_resource_limits_the_entities_it_reaches() -> None:
    guard, clock = guard_with(("k", ["Listen"], None, KEY_A, KEY_B))
    topic = generate_sas_token("sb://x/Topic", "k", KEY_A, int(clock.t + 60))
    guard.check(topic, LISTEN, "topic/Subscriptions/s")
    with pytest.raises(ServiceBusAuthorizationError, match="not '/topic2'"):
        guard.check(topic, LISTEN, "topic2")
    assert covers("/", "/a") and covers("/a", "/a/b") and not covers("/a", "/ab")
    assert resource_path("sb://h:5671/Orders/") == "/orders" == resource_path("orders")


def test_an_entity_rule_cannot_sign_for_the_namespace_or_another_entity() -> None:
    guard, clock = guard_with(("k", ["Send"], "orders", KEY_A, KEY_B))
    ok = generate_sas_token("sb://x/orders", "k", KEY_A, int(clock.t + 60))
    guard.check(ok, SEND, "orders")
    for resource in ("sb://x/", "sb://x/payments"):
        token = generate_sas_token(resource, "k", KEY_A, int(clock.t + 60))
        with pytest.raises(ServiceBusAuthenticationError, match="not signed by a current key"):
            guard.check(token, SEND, "orders")


def test_expiry_is_checked_on_every_call_even_for_a_cached_token() -> None:
    guard, clock = guard_with(("k", ["Send"], None, KEY_A, KEY_B))
    token = generate_sas_token("sb://x/", "k", KEY_A, int(clock.t + 10))
    guard.check(token, SEND, "q")
    clock.t += 11
    with pytest.raises(ServiceBusAuthenticationError, match="expired"):
        guard.check(token, SEND, "q")


def test_either_key_signs_and_a_rule_change_drops_cached_grants() -> None:
    table = AccessTable()
    table.put(table.validate("k", ["Send"], None, KEY_A, KEY_B))
    clock = FakeClock()
    guard = Guard(INTERNAL_TOKEN, clock)
    guard.load(*table.snapshot())
    by_primary = generate_sas_token("sb://x/", "k", KEY_A, int(clock.t + 60))
    by_secondary = generate_sas_token("sb://x/", "k", KEY_B, int(clock.t + 60))
    guard.check(by_primary, SEND, "q")
    guard.check(by_secondary, SEND, "q")
    table.put(table.regenerated("k", None, "primary", "C" * 32))
    guard.load(*table.snapshot())
    guard.check(by_secondary, SEND, "q")  # clients moved to the secondary keep working
    with pytest.raises(ServiceBusAuthenticationError):
        guard.check(by_primary, SEND, "q")
    table.remove("k", None)
    table.put(table.validate("other", ["Send"], None, KEY_A, KEY_B))
    guard.load(*table.snapshot())
    with pytest.raises(ServiceBusAuthenticationError):
        guard.check(by_secondary, SEND, "q")


def test_more_tokens_than_the_cache_holds_stay_correct_in_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``cache_size`` distinct tokens the oldest grant is evicted: memory stays bounded,
    every answer stays what a fresh verification gives (rights, expiry, a removed key), and a
    token still in the cache is not verified again."""
    table = AccessTable()
    table.put(table.validate("send", ["Send"], None, KEY_A, KEY_B))
    table.put(table.validate("listen", ["Listen"], None, KEY_B, KEY_A))
    clock = FakeClock()
    guard = Guard(INTERNAL_TOKEN, clock, cache_size=3)
    guard.load(*table.snapshot())
    verified: list[str] = []
    real_verify = guard._verify

    def counting(auth: str, path: str) -> object:
        verified.append(auth)
        return real_verify(auth, path)

    monkeypatch.setattr(guard, "_verify", counting)
    # Ten distinct tokens (distinct expiries), alternately Send and Listen, half short-lived.
    tokens = [
        (
            generate_sas_token("sb://x/", name, key, int(clock.t + (10 if i % 2 else 600) + i)),
            right,
            i % 2 == 1,
        )
        for i, (name, key, right) in enumerate(
            [("send", KEY_A, SEND), ("listen", KEY_B, LISTEN)] * 5
        )
    ]
    for token, right, _short in tokens:
        guard.check(token, right, "q")
        wrong = LISTEN if right is SEND else SEND
        with pytest.raises(ServiceBusAuthorizationError, match=f"not {wrong.value}"):
            guard.check(token, wrong, "q")  # the cached grant keeps the rule's rights
        assert guard.cached_tokens <= 3
    assert verified == [t for t, _r, _s in tokens]  # each verified once while it stayed cached

    clock.t += 100  # the short-lived half expires, evicted ones included
    verified.clear()
    for token, right, short in tokens:
        if short:
            with pytest.raises(ServiceBusAuthenticationError, match="expired"):
                guard.check(token, right, "q")
        else:
            guard.check(token, right, "q")
        assert guard.cached_tokens <= 3
    assert len(verified) == len(tokens)  # all had been evicted: each verified again

    table.remove("send", None)  # a removed key stops working, however full the cache was
    guard.load(*table.snapshot())
    assert guard.cached_tokens == 0
    for token, right, short in tokens:
        if right is SEND and not short:
            with pytest.raises(ServiceBusAuthenticationError, match="not signed"):
                guard.check(token, right, "q")
    with pytest.raises(InvalidArgumentError, match="cache_size"):
        Guard(INTERNAL_TOKEN, clock, cache_size=0)


def test_older_pushes_are_ignored() -> None:
    table = AccessTable()
    table.put(table.validate("k", ["Send"], None, KEY_A, KEY_B))
    new = table.snapshot()
    guard = Guard(INTERNAL_TOKEN, FakeClock())
    assert guard.load(*new)
    assert not guard.load(0, ())
    assert not guard.open


def test_internal_methods_take_only_the_brokers_token() -> None:
    guard, clock = guard_with(("admin", ["Manage"], None, KEY_A, KEY_B))
    admin = generate_sas_token("sb://x/", "admin", KEY_A, int(clock.t + 60))
    guard.check(INTERNAL_TOKEN, INTERNAL, "q")
    guard.check(INTERNAL_TOKEN, MANAGE, "q")
    with pytest.raises(ServiceBusAuthorizationError, match="internal"):
        guard.check(admin, INTERNAL, "q")
    with pytest.raises(ServiceBusAuthorizationError):
        guard.check("RaybusInternal guessed", INTERNAL, "q")


@pytest.mark.parametrize(
    "name, rights, key, argument",
    [
        ("", ["Send"], None, "key_name"),
        ("bad name", ["Send"], None, "key_name"),
        ("k", [], None, "rights"),
        ("k", ["Write"], None, "rights"),
        ("k", ["Send"], "short", "primary_key"),
    ],
)
def test_bad_rules_are_refused_with_the_field_named(
    name: str, rights: list[str], key: str | None, argument: str
) -> None:
    table = AccessTable()
    with pytest.raises(InvalidArgumentError) as info:
        table.validate(name, rights, None, key, None)
    assert info.value.argument == argument
    assert table.version == 0 and not table.rules


def test_removing_unknown_rules_and_entities() -> None:
    table = AccessTable()
    with pytest.raises(MessagingEntityNotFoundError):
        table.remove("nope", None)
    table.put(table.validate("k", ["Send"], "t", None, None))
    table.put(table.validate("k", ["Send"], "t/Subscriptions/s", None, None))
    table.put(table.validate("k", ["Send"], "t2", None, None))
    assert table.remove_entity("t")
    assert [r.entity for r in table.rules.values()] == ["t2"]
    assert not table.remove_entity("t")


def test_credentials_sign_per_entity_and_reuse_tokens() -> None:
    cred = SharedAccessKeyCredential("k", KEY_A, ttl=3600)
    first = cred.token_for("/orders")
    assert cred.token_for("/orders") is first
    assert parse_sas_token(first).path == "/orders"
    assert SasTokenCredential(first).token_for("/anything") == first
    with pytest.raises(ServiceBusAuthenticationError):
        SasTokenCredential("nonsense")
    with pytest.raises(InvalidArgumentError):
        SharedAccessKeyCredential("", KEY_A)


def test_auth_errors_pickle() -> None:
    for exc in (
        ServiceBusAuthenticationError("no token", "q"),
        ServiceBusAuthorizationError("no right", "q"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


def test_client_caches_keep_one_coalescer_per_actor_behind_authed_handles() -> None:
    """With a credential every route handle is an ``AuthedHandle`` (and each route fetched
    wraps the handles anew). The client keeps one send, settle and publish coalescer per
    actor, keyed on ``handle._actor_id``: that must be the wrapped actor's id, not a wrapped
    attribute made anew per read (a coalescer per call, kept for ever, nothing batched)."""

    class Handle:
        _actor_id = "partition-actor-id"
        send_groups = settle = publish = None  # looked up as the coalescers are made

    plain = Handle()
    handle = AuthedHandle(plain, lambda: "token")
    conn = Connection.__new__(Connection)  # no Ray: only the caches
    conn._senders, conn._settlers, conn._publishers = {}, {}, {}
    for _ in range(1000):
        conn.sender("q", handle)
        conn.settler("q", handle)
        conn.publisher("t", handle)
    rewrapped = AuthedHandle(plain, lambda: "token")  # from a route fetched again
    assert conn.settler("q", rewrapped) is conn.settler("q", handle)
    assert conn.sender("q", rewrapped) is conn.sender("q", handle)
    assert (len(conn._senders), len(conn._settlers), len(conn._publishers)) == (1, 1, 1)
    assert handle._actor_id == "partition-actor-id"
    with pytest.raises(TypeError, match="unwrap"):  # still never pickled with its token
        pickle.dumps(handle)


def test_the_cli_takes_its_credential_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raybus.cli._context import CliContext

    for var in ("RAYBUS_SAS_TOKEN", "RAYBUS_KEY_NAME", "RAYBUS_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert CliContext().credential() is None
    monkeypatch.setenv("RAYBUS_KEY_NAME", "app")
    monkeypatch.setenv("RAYBUS_KEY", KEY_A)
    cred = CliContext().credential()
    assert isinstance(cred, SharedAccessKeyCredential) and cred.key_name == "app"
    token = generate_sas_token("sb://x/", "app", KEY_A, 2_000_000_000)
    monkeypatch.setenv("RAYBUS_SAS_TOKEN", token)
    assert CliContext().credential().token_for("/q") == token
