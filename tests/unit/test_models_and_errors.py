"""Queue properties and their validation, entity names, AMQP value rules of a record, and the
exception classes (spec §1.2, §1.12, §2; STYLE principle 4)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)

import raybus.exceptions as exc_module
from raybus._core.record import MessageRecord, encoded_size
from raybus._models import (
    MAX_DURATION,
    PARTITIONED_QUEUE_PARTITIONS,
    QueueProperties,
    sdk_queue_options,
    validate_entity_name,
)
from raybus._topic_models import SubscriptionProperties, TopicProperties, sdk_topic_options
from raybus.enums import EntityStatus
from raybus.exceptions import InvalidArgumentError, MessageSizeExceededError, ServiceBusError

# ---------------------------------------------------------------- QueueProperties defaults


def test_queue_properties_defaults_match_service_bus():
    q = QueueProperties(name="orders")
    assert q.lock_duration == timedelta(seconds=60)
    assert q.max_delivery_count == 10
    assert q.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert q.max_size_in_megabytes == 1024
    assert q.max_message_size_in_kilobytes == 256
    assert q.status is EntityStatus.ACTIVE
    assert q.default_message_time_to_live == MAX_DURATION
    assert q.auto_delete_on_idle == MAX_DURATION
    assert q.dead_lettering_on_message_expiration is False
    assert q.requires_duplicate_detection is False
    assert q.requires_session is False
    assert q.enable_batched_operations is True


def test_queue_properties_seconds_views():
    q = QueueProperties(name="orders")
    assert q.lock_duration_s == 60.0
    assert q.dedup_window_s == 600.0
    assert q.default_ttl_s == float("inf")
    assert q.auto_delete_on_idle_s == float("inf")
    assert q.max_message_size == 256 * 1024
    assert q.max_size == 1024 * 1024 * 1024


def test_queue_properties_accept_numbers_as_seconds_and_status_strings():
    q = QueueProperties(name="orders", lock_duration=30, status="SendDisabled")
    assert q.lock_duration == timedelta(seconds=30)
    assert q.status is EntityStatus.SEND_DISABLED


def test_topics_and_subscriptions_take_only_the_statuses_service_bus_gives_them():
    """A topic: Active, Disabled, SendDisabled; a subscription: Active, Disabled,
    ReceiveDisabled (a topic is not received from, a subscription not sent to)."""
    for status in ("Active", "Disabled", "SendDisabled"):
        assert TopicProperties("t", status=status).status == status
    for status in ("Active", "Disabled", "ReceiveDisabled"):
        assert SubscriptionProperties("t", "s", status=status).status == status
    with pytest.raises(InvalidArgumentError, match="topic can have") as info:
        TopicProperties("t", status=EntityStatus.RECEIVE_DISABLED)
    assert info.value.argument == "status"
    with pytest.raises(InvalidArgumentError, match="subscription can have"):
        SubscriptionProperties("t", "s", status="SendDisabled")
    with pytest.raises(InvalidArgumentError, match="subscription can have"):
        dataclasses.replace(SubscriptionProperties("t", "s"), status="Paused")


@pytest.mark.parametrize("status", ["Creating", "Deleting", "Renaming", "Restoring", "Unknown"])
def test_service_bus_own_statuses_are_the_sdks_names_and_no_entity_takes_them(status):
    """EntityStatus has the SDK's members for Service Bus's passing states; Service Bus sets
    those itself, so no queue, topic or subscription is created or updated with one."""
    assert EntityStatus(status).value == status
    assert not EntityStatus(status).can_send and not EntityStatus(status).can_receive
    for make, kind in (
        (lambda: QueueProperties("q", status=status), "queue"),
        (lambda: TopicProperties("t", status=EntityStatus(status)), "topic"),
        (lambda: SubscriptionProperties("t", "s", status=status), "subscription"),
        (lambda: dataclasses.replace(QueueProperties("q"), status=status), "queue"),
    ):
        with pytest.raises(InvalidArgumentError, match=f"'{status}' is not one a {kind}"):
            make()


def test_the_management_module_has_the_sdks_enums_and_count_model():
    import azure.servicebus.management as sdk

    import raybus.management as ours

    for name in ("MessagingSku", "NamespaceType", "EntityStatus", "EntityAvailabilityStatus"):
        theirs = {m.name: m.value for m in getattr(sdk, name)}
        assert {m.name: m.value for m in getattr(ours, name)} == theirs, name
    counts = ours.MessageCountDetails(active_message_count=3, dead_letter_message_count=1)
    assert (counts.active_message_count, counts.scheduled_message_count) == (3, None)
    assert ours.MessagingSku.STANDARD == "Standard"  # what NamespaceProperties reads


def test_true_and_false_filters_are_sql_filters_as_the_sdks_and_match_without_sql():
    from raybus.management import FalseRuleFilter, SqlRuleFilter, TrueRuleFilter

    true, false = TrueRuleFilter(), FalseRuleFilter()
    assert isinstance(true, SqlRuleFilter) and isinstance(false, SqlRuleFilter)
    assert (true.sql_expression, false.sql_expression) == ("1=1", "1=0")
    assert (true.parameters, repr(true), repr(false)) == (
        None,
        "TrueRuleFilter()",
        "FalseRuleFilter()",
    )
    assert roundtrip(true) == true and true != SqlRuleFilter("1=1") and true != false
    assert true.matches(None) and not false.matches(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TrueRuleFilter("1=0")  # type: ignore[call-arg]


def test_queue_properties_are_validated_again_on_replace():
    q = QueueProperties(name="orders")
    with pytest.raises(InvalidArgumentError):
        dataclasses.replace(q, max_delivery_count=0)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"lock_duration": timedelta(minutes=5, seconds=1)}, "lock_duration"),
        ({"lock_duration": timedelta(0)}, "lock_duration"),
        ({"lock_duration": 0}, "lock_duration"),
        ({"lock_duration": "60s"}, "lock_duration"),
        ({"max_delivery_count": 0}, "max_delivery_count"),
        ({"max_delivery_count": True}, "max_delivery_count"),
        ({"max_delivery_count": 2.5}, "max_delivery_count"),
        (
            {"duplicate_detection_history_time_window": timedelta(seconds=19)},
            "duplicate_detection_history_time_window",
        ),
        (
            {"duplicate_detection_history_time_window": timedelta(days=8)},
            "duplicate_detection_history_time_window",
        ),
        ({"status": "Paused"}, "status"),
        ({"auto_delete_on_idle": timedelta(minutes=4, seconds=59)}, "auto_delete_on_idle"),
        ({"default_message_time_to_live": timedelta(0)}, "default_message_time_to_live"),
        ({"max_size_in_megabytes": 0}, "max_size_in_megabytes"),
        ({"max_message_size_in_kilobytes": 102_401}, "max_message_size_in_kilobytes"),
        ({"requires_duplicate_detection": "yes"}, "requires_duplicate_detection"),
    ],
)
def test_invalid_queue_properties_raise_invalid_argument_naming_it(options, argument):
    with pytest.raises(InvalidArgumentError) as info:
        QueueProperties(name="orders", **options)
    assert info.value.argument == argument
    assert argument in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"lock_duration": timedelta(minutes=5)},
        {"lock_duration": timedelta(milliseconds=100)},
        {"max_delivery_count": 1},
        {"duplicate_detection_history_time_window": timedelta(seconds=20)},
        {"duplicate_detection_history_time_window": timedelta(days=7)},
        {"auto_delete_on_idle": timedelta(minutes=5)},
        {"max_size_in_megabytes": 1},
    ],
)
def test_boundary_queue_properties_are_accepted(options):
    QueueProperties(name="orders", **options)


def test_queue_properties_reject_bad_name():
    with pytest.raises(InvalidArgumentError) as info:
        QueueProperties(name="bad name")
    assert info.value.argument == "name"


# ---------------------------------------------------------------- entity names


@pytest.mark.parametrize("name", ["a", "orders-1.v2/sub_x", "A1", "x" * 260, "a.b-c_d/e/f"])
def test_validate_entity_name_accepts_valid_names(name):
    assert validate_entity_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-a", "a-", ".a", "a/", "/a", "a//b", "a b", "a*b", "é", "x" * 261, "q/$DeadLetterQueue"],
)
def test_validate_entity_name_rejects_invalid_names(name):
    with pytest.raises(InvalidArgumentError) as info:
        validate_entity_name(name)
    assert info.value.argument == "name"


@pytest.mark.parametrize("name", [None, 1, b"orders", ["orders"]])
def test_validate_entity_name_rejects_non_str(name):
    with pytest.raises(InvalidArgumentError) as info:
        validate_entity_name(name)
    assert info.value.argument == "name"


# ---------------------------------------------------------------- record encoding rules


@pytest.mark.parametrize(
    "value", [[1, 2], (1, 2), {"a": 1}, {1, 2}, object(), 1 + 2j, 2**64, -(2**63) - 1]
)
def test_encoded_size_rejects_non_primitive_application_property_values(value):
    rec = MessageRecord(body=b"", application_properties={"k": value})
    with pytest.raises(InvalidArgumentError):
        encoded_size(rec)


@pytest.mark.parametrize("key", [1, None, b"k", ("k",)])
def test_encoded_size_rejects_non_str_application_property_keys(key):
    rec = MessageRecord(body=b"", application_properties={key: 1})
    with pytest.raises(InvalidArgumentError) as info:
        encoded_size(rec)
    assert info.value.argument == "application_properties"


def test_encoded_size_rejects_application_properties_that_are_not_a_dict():
    with pytest.raises(InvalidArgumentError):
        encoded_size(MessageRecord(body=b"", application_properties=[("k", 1)]))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [None, True, 0, 2**64 - 1, -(2**63), 1.5, "s", b"b", uuid.uuid4(), datetime.now(timezone.utc)],
)
def test_encoded_size_accepts_primitive_application_property_values(value):
    rec = MessageRecord(body=b"", application_properties={"k": value})
    assert encoded_size(rec) > 0


def test_encoded_size_rejects_message_id_over_128_characters():
    encoded_size(MessageRecord(message_id="m" * 128))
    with pytest.raises(InvalidArgumentError) as info:
        encoded_size(MessageRecord(message_id="m" * 129))
    assert info.value.argument == "message_id"


def test_a_lone_message_id_is_checked_and_sized_as_when_other_fields_are_set():
    """The one-step path for a message id alone (every message gets one) must agree with
    the walk over every field: UTF-8 size, and the same refusals."""

    def size(**fields: object) -> int:
        return encoded_size(MessageRecord(body=b"", **fields))  # type: ignore[arg-type]

    for mid in ("m", "e" * 64, "é" * 64, "m" * 128):
        assert size(message_id=mid) - size() == size(message_id=mid, subject="s") - size(
            subject="s"
        )
    assert size(message_id="é" * 64) - size(message_id="e" * 64) == 64  # UTF-8 bytes
    for bad in ("", 42, "m" * 129):
        with pytest.raises(InvalidArgumentError) as info:
            size(message_id=bad)
        assert info.value.argument == "message_id"


@pytest.mark.parametrize("field", ["session_id", "partition_key"])
def test_encoded_size_rejects_session_and_partition_key_over_128_characters(field):
    with pytest.raises(InvalidArgumentError) as info:
        encoded_size(MessageRecord(**{field: "s" * 129}))
    assert info.value.argument == field


def test_encoded_size_rejects_non_str_system_properties():
    with pytest.raises(InvalidArgumentError) as info:
        encoded_size(MessageRecord(correlation_id=42))  # type: ignore[arg-type]
    assert info.value.argument == "correlation_id"


@pytest.mark.parametrize(
    "body",
    [
        [1, "two", b"three", [4.0]],
        {"a": 1, "nested": {"b": [True, None]}},
        uuid.uuid4(),
        datetime(2030, 1, 1, tzinfo=timezone.utc),
        None,
        "text",
        b"bytes",
    ],
)
def test_encoded_size_accepts_amqp_bodies_and_sets_size(body):
    rec = MessageRecord(body=body)
    size = encoded_size(rec)
    assert size > 0
    assert rec.size == size


@pytest.mark.parametrize("body", [object(), {1, 2}, [object()], {"k": object()}])
def test_encoded_size_rejects_non_amqp_bodies(body):
    with pytest.raises(InvalidArgumentError):
        encoded_size(MessageRecord(body=body))


def test_encoded_size_counts_the_same_for_every_kind_of_string_and_binary_body():
    """bytes take a shortcut past the type checks; it must count as the general rule does
    (a bytearray, a str of the same length, a list's bytes element minus the list's own 9)."""
    for n in (0, 1, 1000):
        expect = encoded_size(MessageRecord(body="x" * n))
        assert encoded_size(MessageRecord(body=b"x" * n)) == expect
        assert encoded_size(MessageRecord(body=bytearray(b"x" * n))) == expect
        assert encoded_size(MessageRecord(body=[b"x" * n])) - 9 == expect


def test_encoded_size_counts_each_system_string_property():
    plain = encoded_size(MessageRecord(body=b""))
    for name in ("message_id", "correlation_id", "session_id", "subject", "to", "content_type"):
        assert encoded_size(MessageRecord(body=b"", **{name: "abc"})) == plain + 5 + 3


def test_encoded_size_grows_with_the_body():
    small = MessageRecord(body=b"x")
    big = MessageRecord(body=b"x" * 1001)
    assert encoded_size(big) - encoded_size(small) == 1000


def test_application_properties_over_64_kib_in_total_raise_message_size_exceeded():
    props = {f"k{i}": "v" * 30_000 for i in range(3)}  # each under 32 KiB, together ~90 KB
    with pytest.raises(MessageSizeExceededError) as info:
        encoded_size(MessageRecord(body=b"", application_properties=props))
    assert info.value.max_size == 64 * 1024
    assert info.value.size > 64 * 1024


def test_single_application_property_over_32_kib_raises_message_size_exceeded():
    with pytest.raises(MessageSizeExceededError) as info:
        encoded_size(MessageRecord(application_properties={"k": "v" * (33 * 1024)}))
    assert info.value.max_size == 32 * 1024


@pytest.mark.parametrize("field", ["correlation_id", "subject", "to", "reply_to", "content_type"])
def test_a_system_string_property_over_32_kib_raises_message_size_exceeded(field):
    # Each property within 32 KB, the system ones too (Service Bus's quota counts Label and
    # the ids); the ids of at most 128 characters are refused before this.
    encoded_size(MessageRecord(**{field: "v" * (32 * 1024 - 5)}))
    with pytest.raises(MessageSizeExceededError, match=field) as info:
        encoded_size(MessageRecord(**{field: "v" * (32 * 1024 - 4)}))
    assert (info.value.size, info.value.max_size) == (32 * 1024 + 1, 32 * 1024)


# ---------------------------------------------------------------- exceptions

# Constructor arguments and expected fields of the classes with fields of their own. Every other
# class in __all__ is built as cls("text", "orders").
EXAMPLES: dict[str, tuple[tuple, dict]] = {
    "InvalidArgumentError": (("bad arg", "orders", "lock_duration"), {"argument": "lock_duration"}),
    "MessageSizeExceededError": (("too big", "orders", 300, 256), {"size": 300, "max_size": 256}),
    "ServiceBusQuotaExceededError": (
        ("full", "orders", 2048, 1024),
        {"size": 2048, "max_size": 1024},
    ),
    "MessageLockLostError": (
        ("lock lost", "orders", "tok-1", 42),
        {"lock_token": "tok-1", "sequence_number": 42},
    ),
    "SettlementFailedError": (
        ("settle failed", "orders", [(7, "tok-7", "lock lost"), (8, "tok-8", "gone")]),
        {
            "failures": [(7, "tok-7", "lock lost"), (8, "tok-8", "gone")],
            "lock_token": "tok-7",
            "sequence_number": 7,
        },
    ),
    "MessageNotFoundError": (("missing", "orders", [3, 4]), {"sequence_numbers": [3, 4]}),
    "MessagesMovedError": (
        ("moved", "orders", [3, 4], {3: 1, 4: 2}),
        {"sequence_numbers": [3, 4], "moved": {3: 1, 4: 2}},
    ),
    "MessagingEntityDisabledError": (("disabled", "orders", "Disabled"), {"status": "Disabled"}),
    "MessageAlreadySettled": (("already settled",), {"message": "already settled"}),
    "FilterSyntaxError": (
        ("bad filter", "orders/subscriptions/s1", "a = = 1", 4),
        {"text": "a = = 1", "position": 4},
    ),
    "FilterEvaluationError": (
        ("1/0", "orders/subscriptions/s1", "DivideByZero"),
        {"type_name": "DivideByZero"},
    ),
    "PartitionMovedError": (("moved", "orders", 3), {"version": 3}),
    "TransactionAbortedError": (
        ("rolled back", "orders", "t-1", "MessageLockLostError: gone"),
        {"transaction_id": "t-1", "reason": "MessageLockLostError: gone"},
    ),
    "TransactionTimeoutError": (
        ("too late", "orders", "t-2", "timeout"),
        {"transaction_id": "t-2", "reason": "timeout"},
    ),
}

ALL_EXCEPTIONS = sorted(exc_module.__all__)


def build(name: str) -> BaseException:
    cls = getattr(exc_module, name)
    args, _ = EXAMPLES.get(name, (("something failed", "orders"), {}))
    return cls(*args)


def roundtrip(exc: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(exc))


def test_every_name_in_all_is_an_exception_class():
    for name in ALL_EXCEPTIONS:
        cls = getattr(exc_module, name)
        assert inspect.isclass(cls) and issubclass(cls, Exception), name


@pytest.mark.parametrize("name", ALL_EXCEPTIONS)
def test_exception_round_trips_through_pickle_with_type_str_and_fields(name):
    exc = build(name)
    loaded = roundtrip(exc)
    assert type(loaded) is type(exc)
    assert str(loaded) == str(exc)
    assert loaded.args == exc.args
    assert vars(loaded) == vars(exc)
    for field, value in EXAMPLES.get(name, ((), {}))[1].items():
        assert getattr(exc, field) == value, field
        assert getattr(loaded, field) == value, field


@pytest.mark.parametrize("name", ALL_EXCEPTIONS)
def test_exception_round_trips_through_pickle_after_being_raised(name):
    exc = build(name)
    with pytest.raises(type(exc)) as info:
        raise exc
    assert info.value.__traceback__ is not None
    loaded = roundtrip(info.value)
    assert type(loaded) is type(exc)
    assert str(loaded) == str(exc)


@pytest.mark.parametrize("name", ALL_EXCEPTIONS)
def test_exception_with_default_fields_round_trips_through_pickle(name):
    cls = getattr(exc_module, name)
    exc = cls("minimal")
    loaded = roundtrip(exc)
    assert type(loaded) is type(exc)
    assert str(loaded) == str(exc) == "minimal"
    assert vars(loaded) == vars(exc)


@pytest.mark.parametrize("name", ALL_EXCEPTIONS)
def test_exception_has_a_bool_class_attribute_retryable(name):
    cls = getattr(exc_module, name)
    assert "retryable" in dir(cls)
    assert type(cls.retryable) is bool


# azure-servicebus's retryable flags (spec §2); raybus-only classes are not retryable.
RETRYABLE = {
    "ServiceBusError": False,
    "ServiceBusConnectionError": True,
    "OperationTimeoutError": True,
    "ServiceBusServerBusyError": True,
    "MessageSizeExceededError": False,
    "MessageAlreadySettled": False,
    "MessageLockLostError": False,
    "SessionLockLostError": False,
    "SessionCannotBeLockedError": True,
    "MessageNotFoundError": False,
    "MessagingEntityNotFoundError": False,
    "MessagingEntityDisabledError": True,
    "MessagingEntityAlreadyExistsError": False,
    "ServiceBusQuotaExceededError": False,
    "AutoLockRenewFailed": False,
    "AutoLockRenewTimeout": False,
    "InvalidArgumentError": False,
    "SettlementFailedError": False,
    "FilterSyntaxError": False,
    "FilterEvaluationError": False,
}


@pytest.mark.parametrize("name", sorted(RETRYABLE))
def test_retryable_flag_matches_service_bus(name):
    assert getattr(exc_module, name).retryable is RETRYABLE[name]


def test_exception_hierarchy_matches_azure_servicebus():
    assert issubclass(exc_module.MessageSizeExceededError, ValueError)
    assert issubclass(exc_module.MessageAlreadySettled, ValueError)
    assert not issubclass(exc_module.MessageAlreadySettled, ServiceBusError)
    assert issubclass(exc_module.SettlementFailedError, exc_module.MessageLockLostError)
    for name in ALL_EXCEPTIONS:
        if name != "MessageAlreadySettled":
            assert issubclass(getattr(exc_module, name), ServiceBusError), name


@pytest.mark.parametrize("name", ALL_EXCEPTIONS)
def test_every_error_is_built_as_the_sdk_builds_its_own_by_keywords_or_none(name):
    """azure-servicebus's errors take keywords only (``message=``, ``error=``) and have a text
    of their own; code written for it (and its tests' fakes) builds them so."""
    cls = getattr(exc_module, name)
    bare = cls()
    assert str(bare) and bare.message == str(bare)
    assert str(cls(message="custom")) == "custom"
    if name == "MessageAlreadySettled":  # a ValueError, as the SDK's; worded by the action
        assert "Unable to complete message" in str(cls(action="complete"))
        return
    cause = KeyError("k")
    exc = cls(message="wrapped", error=cause)
    assert exc.inner_exception is cause and isinstance(exc, AzureError)
    assert str(roundtrip(exc)) == "wrapped"
    assert str(cls(b"as bytes")) == "as bytes"
    with pytest.raises(TypeError):
        cls(message="x", condition="amqp:not-found")  # the SDK's private keywords: not taken


def test_the_errors_are_azure_cores_as_the_sdks_are_and_the_admin_ones_its_http_errors():
    import azure.servicebus.exceptions as sdk

    for name in ALL_EXCEPTIONS:
        ours, theirs = getattr(exc_module, name), getattr(sdk, name, None)
        if theirs is not None:
            assert issubclass(ours, AzureError) == issubclass(theirs, AzureError), name
            assert issubclass(ours, ValueError) == issubclass(theirs, ValueError), name
    http = {
        "MessagingEntityNotFoundError": (ResourceNotFoundError, 404),
        "MessagingEntityAlreadyExistsError": (ResourceExistsError, 409),
        "ServiceBusAuthenticationError": (ClientAuthenticationError, 401),
        "ServiceBusAuthorizationError": (ClientAuthenticationError, 401),
    }
    for name, (base, status) in http.items():
        exc = roundtrip(getattr(exc_module, name)("no", "orders"))
        assert isinstance(exc, base) and isinstance(exc, ServiceBusError), name
        assert (exc.status_code, exc.response, exc.error) == (status, None, None), name
        assert str(exc) == "no (entity: orders)"
    assert not isinstance(exc_module.MessageLockLostError("x"), HttpResponseError)


def test_service_bus_error_str_names_the_entity():
    assert str(ServiceBusError("boom", "orders")) == "boom (entity: orders)"
    assert str(ServiceBusError("boom")) == "boom"


def test_a_rolled_back_transaction_carries_the_refusal_itself_across_pickling() -> None:
    import pickle

    from raybus.exceptions import ServiceBusQuotaExceededError, TransactionAbortedError

    cause = ServiceBusQuotaExceededError("full", "q", 10, 5)
    exc = TransactionAbortedError(
        "rolled back", "q", "t1", "ServiceBusQuotaExceededError: full", cause
    )
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back.cause, ServiceBusQuotaExceededError)
    assert (back.cause.size, back.cause.max_size, back.transaction_id) == (10, 5, "t1")


def test_a_received_time_to_live_is_right_past_the_cache_of_shared_timedeltas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raybus import message

    monkeypatch.setattr(message, "_TTLS", {})
    ttls = [0.5 + i for i in range(1500)]  # more distinct values than the cache keeps
    got = [message._time_to_live(s) for s in ttls]
    assert got == [timedelta(seconds=s) for s in ttls]
    assert len(message._TTLS) <= 1024  # bounded: the rest are built, not kept
    assert message._time_to_live(ttls[0]) is message._time_to_live(ttls[0])  # shared
    assert message._time_to_live(ttls[-1]) == timedelta(seconds=ttls[-1])
    assert message._time_to_live(None) is None and message._time_to_live(float("inf")) is None


def test_every_field_a_sender_sets_reaches_the_record_in_its_place() -> None:
    from dataclasses import fields

    from raybus import ServiceBusMessage, message

    # _build_record passes MessageRecord's first 13 fields by position, in this order.
    head = ["body", "application_properties", *message._FIELDS]
    head += ["time_to_live", "scheduled_enqueue_time"]
    assert [f.name for f in fields(MessageRecord)][: len(head)] == head
    strings = {name: f"{name}-value" for name in message._FIELDS}
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    m = ServiceBusMessage(
        bytearray(b"body"),
        application_properties={"k": 1},
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time_utc=at,
        **strings,
    )
    rec = m._to_record()
    assert rec.body == b"body" and type(rec.body) is bytes
    assert rec.application_properties == {"k": 1}
    assert rec.application_properties is not m.application_properties
    assert {name: getattr(rec, name) for name in strings} == strings
    assert rec.time_to_live == 90.0 and rec.scheduled_enqueue_time == at.timestamp()
    assert rec.size > 0 and rec.sequence_number == 0 and rec.lock_token is None


def test_system_string_fields_given_as_bytes_read_and_are_stored_as_their_utf8_str() -> None:
    # The SDK takes these fields as bytes and its getters read them back decoded.
    from raybus import ServiceBusMessage, message

    given = {name: f"{name}-é".encode() for name in message._FIELDS}
    given["partition_key"] = given["session_id"]  # must equal the session when both are set
    m = ServiceBusMessage(b"body", **given)
    expected = {name: value.decode() for name, value in given.items()}
    assert {name: getattr(m, name) for name in given} == expected
    assert all(type(getattr(m, name)) is str for name in given)
    rec = m._to_record()
    assert {name: getattr(rec, name) for name in given} == expected
    assert rec.size == ServiceBusMessage(b"body", **expected)._to_record().size
    m.subject = b"changed"  # set later, the same
    assert m.subject == "changed" and m._to_record().subject == "changed"


@pytest.mark.parametrize("field", ["message_id", "subject", "partition_key"])
def test_a_system_string_field_of_bytes_that_are_not_utf8_is_refused_by_name(field: str) -> None:
    from raybus import ServiceBusMessage

    with pytest.raises(InvalidArgumentError, match="UTF-8") as info:
        ServiceBusMessage(b"body", **{field: b"\xff\xfe"})
    assert info.value.argument == field
    m = ServiceBusMessage(b"body")
    before = getattr(m, field)
    with pytest.raises(InvalidArgumentError) as info:
        setattr(m, field, b"\xff")
    assert info.value.argument == field and getattr(m, field) == before  # left as it was


def test_a_message_without_an_id_gets_a_unique_one_in_uuid_form_as_the_sdk_gives() -> None:
    """The SDK gives every message it builds without one a ``uuid4()`` id; consumers key on
    it, and duplicate detection drops a message object sent twice."""
    from raybus import ServiceBusMessage

    ids = [ServiceBusMessage(b"m").message_id for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(uuid.UUID(i).version == 4 for i in ids)
    assert ServiceBusMessage(b"m", message_id="mine").message_id == "mine"
    m = ServiceBusMessage(b"m")
    assert m._to_record().message_id == m.message_id  # what a send stores
    m.message_id = None  # unset on purpose: left unset, as in the SDK
    assert m._to_record().message_id is None


def test_a_forked_child_draws_message_ids_of_its_own() -> None:
    import os

    from raybus import ServiceBusMessage

    ServiceBusMessage(b"m")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, ServiceBusMessage(b"m").message_id.encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    parent = ServiceBusMessage(b"m").message_id
    assert child[:24] != parent[:24]  # another prefix, so no id repeats the parent's


def test_body_type_is_the_sdks() -> None:
    from raybus import ServiceBusMessage
    from raybus.amqp import AmqpMessageBodyType
    from raybus.amqp._message import _section, to_raybus

    assert ServiceBusMessage(b"x").body_type is AmqpMessageBodyType.DATA
    assert ServiceBusMessage("x").body_type is AmqpMessageBodyType.DATA
    assert ServiceBusMessage([1, 2]).body_type is AmqpMessageBodyType.VALUE
    assert to_raybus(_section(0x76, [1, "x"])).body_type is AmqpMessageBodyType.SEQUENCE
    adopted = ServiceBusMessage(b"x")
    adopted.raw_amqp_message  # noqa: B018  (its sections from now on)
    assert adopted.body_type is AmqpMessageBodyType.DATA


def test_bytes_system_fields_are_checked_as_strings_after_decoding() -> None:
    from raybus import ServiceBusMessage

    with pytest.raises(InvalidArgumentError) as info:
        ServiceBusMessage(b"body", message_id=b"m" * 129)
    assert info.value.argument == "message_id"
    with pytest.raises(InvalidArgumentError) as info:
        ServiceBusMessage(b"body", session_id=b"")
    assert info.value.argument == "session_id"
    with pytest.raises(InvalidArgumentError) as info:  # other types are still refused
        ServiceBusMessage(b"body", message_id=b"m", correlation_id=42)  # type: ignore[arg-type]
    assert info.value.argument == "correlation_id"


# ---------------------------------------------------------------- the SDK's entity options


def test_enable_partitioning_at_creation_makes_a_partitioned_queue():
    made = sdk_queue_options({"enable_partitioning": True}, None, "q")
    assert made == {"partition_count": PARTITIONED_QUEUE_PARTITIONS}
    props = QueueProperties("q", **made)
    assert props.enable_partitioning and props.partition_count == 4
    assert sdk_queue_options({"enable_partitioning": True, "partition_count": 8}, None, "q") == {
        "partition_count": 8
    }
    assert sdk_queue_options({"enable_partitioning": False}, None, "q") == {}
    assert sdk_queue_options({"enable_partitioning": None, "x": 1}, None, "q") == {"x": 1}
    assert not QueueProperties("q").enable_partitioning
    assert QueueProperties("q", max_partitions=8).enable_partitioning
    with pytest.raises(InvalidArgumentError) as info:
        sdk_queue_options({"enable_partitioning": "yes"}, None, "q")
    assert info.value.argument == "enable_partitioning"


def test_enable_partitioning_on_an_update_may_only_repeat_what_the_queue_is():
    one, four = QueueProperties("q"), QueueProperties("q", partition_count=4)
    assert sdk_queue_options({"enable_partitioning": True}, four, "q") == {}
    assert sdk_queue_options({"enable_partitioning": False}, one, "q") == {}
    for current, wanted in ((one, True), (four, False)):
        with pytest.raises(InvalidArgumentError, match="fixed when the queue is created"):
            sdk_queue_options({"enable_partitioning": wanted}, current, "q")


def test_the_sdks_topic_options_are_taken_and_read_as_service_bus_defaults():
    given = {
        "enable_partitioning": True,
        "enable_express": True,
        "filtering_messages_before_publishing": False,
        "max_size_in_megabytes": 2048,
    }
    assert sdk_topic_options(given, "t") == {"max_size_in_megabytes": 2048}
    topic = TopicProperties("t")
    assert (topic.enable_partitioning, topic.enable_express) == (False, False)
    assert topic.filtering_messages_before_publishing is False
    with pytest.raises(InvalidArgumentError) as info:
        sdk_topic_options({"enable_express": 1}, "t")
    assert info.value.argument == "enable_express"


def test_a_forwarding_entity_is_never_deleted_for_idleness():
    # Service Bus sets a forwarding source's auto_delete_on_idle to the maximum.
    idle = timedelta(minutes=10)
    assert QueueProperties("q", auto_delete_on_idle=idle).auto_delete_on_idle == idle
    forwarding = QueueProperties("q", auto_delete_on_idle=idle, forward_to="dest")
    assert forwarding.auto_delete_on_idle == MAX_DURATION
    dead_letters_only = QueueProperties(
        "q", auto_delete_on_idle=idle, forward_dead_lettered_messages_to="dest"
    )
    assert dead_letters_only.auto_delete_on_idle == idle
    sub = SubscriptionProperties("t", "s", auto_delete_on_idle=idle, forward_to="dest")
    assert sub.auto_delete_on_idle == MAX_DURATION


def test_the_sdks_management_names_availability_and_access_rights() -> None:
    """``availability_status`` on the entity models and the enums the SDK's management module
    exports: code written for it reads and imports them."""
    import raybus.management as mgmt

    for props in (
        QueueProperties("q"),
        TopicProperties("t"),
        SubscriptionProperties("t", "s"),
    ):
        assert props.availability_status is mgmt.EntityAvailabilityStatus.AVAILABLE
        assert props.availability_status == "Available"
    assert {r.value for r in mgmt.AccessRights} == {"Manage", "Send", "Listen"}
    assert [s.value for s in mgmt.EntityAvailabilityStatus] == [
        "Available",
        "Limited",
        "Renaming",
        "Restoring",
        "Unknown",
    ]


def test_a_batch_built_without_a_size_takes_the_sdks_one_mib_and_refuses_a_bad_size() -> None:
    from raybus import ServiceBusMessage, ServiceBusMessageBatch

    batch = ServiceBusMessageBatch()
    assert batch.max_size_in_bytes == 1024 * 1024 == ServiceBusMessageBatch(None).max_size_in_bytes
    batch.add_message(ServiceBusMessage(b"x" * 900_000))
    with pytest.raises(MessageSizeExceededError):
        batch.add_message(ServiceBusMessage(b"x" * 200_000))
    assert len(batch) == 1
    for bad in (0, -1, 1.5, True, "1024"):
        with pytest.raises(InvalidArgumentError, match="max_size_in_bytes"):
            ServiceBusMessageBatch(bad)


def test_the_admin_models_have_the_sdks_dict_protocol() -> None:
    """``azure.servicebus.management``'s models are also dictionaries of their fields (its
    ``DictMixin``); code written for them reads and sets them so."""
    from raybus.management import NamespaceProperties, RuleProperties, TrueRuleFilter

    q = QueueProperties("orders")
    assert q["lock_duration"] == q.get("lock_duration") == timedelta(seconds=60)
    assert "max_delivery_count" in q and q.has_key("status") and "nope" not in q
    assert q["availability_status"] == "Available" and q.get("nope", 7) == 7
    assert dict(q.items())["name"] == "orders" and len(q) == len(q.keys()) == len(q.values())
    q["max_delivery_count"] = 3
    q.update({"user_metadata": "m"}, lock_duration=timedelta(seconds=5))
    assert (q.max_delivery_count, q.user_metadata, q.lock_duration.total_seconds()) == (3, "m", 5)
    del q["user_metadata"]
    assert q.user_metadata is None
    with pytest.raises(KeyError):
        q["nope"]
    with pytest.raises(KeyError):
        q["nope"] = 1
    sub = SubscriptionProperties("t", "s")
    assert sub["topic_name"] == "t" and TopicProperties("t")["status"] == "Active"
    rule = RuleProperties("r", TrueRuleFilter())
    assert rule["filter"] == TrueRuleFilter() and rule.keys()[:2] == ["name", "filter"]
    ns = NamespaceProperties("shop")
    assert ns["messaging_sku"] == "Standard"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ns["name"] = "other"  # read-only, as the namespace's fields are
