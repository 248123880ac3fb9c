"""AMQP 1.0 framing (spec part 2.3) and the performatives, outcomes and terminus types.

A frame is ``size(4) doff(1) type(1) channel(2)``, then the extended header (``doff * 4 - 8``
bytes, ignored), then a body: one described performative and, for a transfer, the payload that
follows it. Performatives decode to ``Performative`` (name plus a field dict), whose fields the
gateway reads by name; they encode from keyword fields, trailing nulls trimmed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ._codec import (
    Array,
    DecodeError,
    Described,
    Symbol,
    UByte,
    UInt,
    ULong,
    decode_value,
    encode,
)

__all__ = [
    "AMQP_HEADER",
    "SASL_HEADER",
    "Performative",
    "decode_body",
    "described_list",
    "error",
    "frame",
    "performative",
]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
FRAME_AMQP, FRAME_SASL = 0, 1
MIN_MAX_FRAME_SIZE = 512

_FIELDS: dict[int, tuple[str, tuple[str, ...]]] = {
    0x10: (
        "open",
        (
            "container_id",
            "hostname",
            "max_frame_size",
            "channel_max",
            "idle_time_out",
            "outgoing_locales",
            "incoming_locales",
            "offered_capabilities",
            "desired_capabilities",
            "properties",
        ),
    ),
    0x11: (
        "begin",
        (
            "remote_channel",
            "next_outgoing_id",
            "incoming_window",
            "outgoing_window",
            "handle_max",
            "offered_capabilities",
            "desired_capabilities",
            "properties",
        ),
    ),
    0x12: (
        "attach",
        (
            "name",
            "handle",
            "role",
            "snd_settle_mode",
            "rcv_settle_mode",
            "source",
            "target",
            "unsettled",
            "incomplete_unsettled",
            "initial_delivery_count",
            "max_message_size",
            "offered_capabilities",
            "desired_capabilities",
            "properties",
        ),
    ),
    0x13: (
        "flow",
        (
            "next_incoming_id",
            "incoming_window",
            "next_outgoing_id",
            "outgoing_window",
            "handle",
            "delivery_count",
            "link_credit",
            "available",
            "drain",
            "echo",
            "properties",
        ),
    ),
    0x14: (
        "transfer",
        (
            "handle",
            "delivery_id",
            "delivery_tag",
            "message_format",
            "settled",
            "more",
            "rcv_settle_mode",
            "state",
            "resume",
            "aborted",
            "batchable",
        ),
    ),
    0x15: ("disposition", ("role", "first", "last", "settled", "state", "batchable")),
    0x16: ("detach", ("handle", "closed", "error")),
    0x17: ("end", ("error",)),
    0x18: ("close", ("error",)),
    0x40: ("sasl_mechanisms", ("sasl_server_mechanisms",)),
    0x41: ("sasl_init", ("mechanism", "initial_response", "hostname")),
    0x42: ("sasl_challenge", ("challenge",)),
    0x43: ("sasl_response", ("response",)),
    0x44: ("sasl_outcome", ("code", "additional_data")),
    # Not performatives, but described lists the gateway reads by field name too.
    0x1D: ("error", ("condition", "description", "info")),
    0x23: ("received", ("section_number", "section_offset")),
    0x24: ("accepted", ()),
    0x25: ("rejected", ("error",)),
    0x26: ("released", ()),
    0x27: ("modified", ("delivery_failed", "undeliverable_here", "message_annotations")),
    # Transactions (AMQP 1.0 part 4): the coordinator target and its control messages.
    0x30: ("coordinator", ("capabilities",)),
    0x31: ("declare", ("global_id",)),
    0x32: ("discharge", ("txn_id", "fail")),
    0x33: ("declared", ("txn_id",)),
    0x34: ("transactional_state", ("txn_id", "outcome")),
    0x28: (
        "source",
        (
            "address",
            "durable",
            "expiry_policy",
            "timeout",
            "dynamic",
            "dynamic_node_properties",
            "distribution_mode",
            "filter",
            "default_outcome",
            "outcomes",
            "capabilities",
        ),
    ),
    0x29: (
        "target",
        (
            "address",
            "durable",
            "expiry_policy",
            "timeout",
            "dynamic",
            "dynamic_node_properties",
            "capabilities",
        ),
    ),
}
_CODES = {name: code for code, (name, _f) in _FIELDS.items()}
# Peers may use symbolic descriptors (amqp:open:list); map them onto the numeric codes.
_SYMBOLIC = {f"amqp:{name.replace('_', '-')}:list": code for code, (name, _f) in _FIELDS.items()}
_SYMBOLIC.update(
    {"amqp:sasl-mechanisms:list": 0x40, "amqp:sasl-init:list": 0x41, "amqp:sasl-outcome:list": 0x44}
)


def descriptor_code(descriptor: Any) -> int | None:
    """The numeric code of a descriptor given as a ulong or as a symbol; None if unknown."""
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return int(descriptor)
    if isinstance(descriptor, str):
        return _SYMBOLIC.get(descriptor)
    return None


@dataclass
class Performative:
    """A decoded described list: its name and its fields (absent ones are None)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.fields.get(key)
        return default if value is None else value


def as_performative(value: Any, expect: str | None = None) -> Performative:
    """A described list as a ``Performative``; ``DecodeError`` if it is not one we know."""
    if not isinstance(value, Described):
        raise DecodeError(
            f"expected a described {expect or 'performative'}, got {type(value).__name__}"
        )
    code = descriptor_code(value.descriptor)
    known = _FIELDS.get(code) if code is not None else None
    if known is None:
        raise DecodeError(f"unknown descriptor {value.descriptor!r}")
    name, names = known
    if expect is not None and name != expect:
        raise DecodeError(f"expected {expect}, got {name}")
    items = value.value
    if not isinstance(items, list):
        raise DecodeError(f"{name} is not a list")
    return Performative(name, dict(zip(names, items, strict=False)))


def described_list(kind: str, /, **fields: Any) -> Described:
    """The described list ``kind`` with ``fields`` in spec order (trailing nulls trimmed)."""
    name = kind
    code = _CODES[name]
    names = _FIELDS[code][1]
    unknown = set(fields) - set(names)
    if unknown:
        raise KeyError(f"{name} has no field(s) {sorted(unknown)}")
    values = [fields.get(n) for n in names]
    while values and values[-1] is None:
        values.pop()
    return Described(ULong(code), values)


def is_coordinator(terminus: Any) -> bool:
    """Whether a link's target is the transaction ``coordinator``."""
    return isinstance(terminus, Described) and descriptor_code(terminus.descriptor) == 0x30


def transactional(state: Any) -> tuple[Any, Any] | None:
    """``(txn-id, outcome)`` of a ``transactional-state``; None for any other state."""
    if not isinstance(state, Described) or descriptor_code(state.descriptor) != 0x34:
        return None
    perf = as_performative(state)
    return perf.get("txn_id"), perf.get("outcome")


def transactional_answer(txn_id: Any, outcome: Described) -> Described:
    """The ``transactional-state`` answering a transactional operation."""
    return described_list("transactional_state", txn_id=txn_id, outcome=outcome)


def performative(kind: str, /, **fields: Any) -> bytes:
    return encode(described_list(kind, **fields))


def error(
    condition: str, description: str | None = None, info: dict[Any, Any] | None = None
) -> Described:
    """An AMQP error (``condition`` becomes a symbol). ``info`` is always sent (an empty map
    when None): pyamqp's sender reads all three fields of a rejected outcome's error."""
    return described_list(
        "error", condition=Symbol(condition), description=description or "", info=info or {}
    )


def frame(body: bytes, channel: int = 0, kind: int = FRAME_AMQP) -> bytes:
    """One frame around ``body`` (an empty body is a heartbeat)."""
    return struct.pack(">IBBH", len(body) + 8, 2, kind, channel) + body


def parse_header(header: bytes, max_frame_size: int) -> tuple[int, int, int, int]:
    """(size, data offset in bytes, type, channel) of an 8-byte frame header."""
    size, doff, kind, channel = struct.unpack(">IBBH", header)
    if size < 8 or doff < 2 or doff * 4 > size:
        raise DecodeError(f"bad frame header: size {size}, doff {doff}")
    if size > max_frame_size:
        raise DecodeError(f"frame of {size} bytes exceeds max-frame-size {max_frame_size}")
    return size, doff * 4, kind, channel


def decode_body(body: bytes) -> tuple[Performative, memoryview]:
    """A frame body as (performative, payload that follows it)."""
    view = memoryview(body)
    value, pos = decode_value(view)
    return as_performative(value), view[pos:]


def symbol_array(*names: str) -> Array:
    return Array(0xA3, tuple(Symbol(n) for n in names))


def sasl_mechanisms(*names: str) -> bytes:
    return frame(
        performative("sasl_mechanisms", sasl_server_mechanisms=symbol_array(*names)),
        kind=FRAME_SASL,
    )


def sasl_outcome(code: int) -> bytes:
    return frame(performative("sasl_outcome", code=UByte(code)), kind=FRAME_SASL)


def flow_fields(
    next_incoming_id: int, incoming_window: int, next_outgoing_id: int, outgoing_window: int
) -> dict[str, Any]:
    return {
        "next_incoming_id": UInt(next_incoming_id & 0xFFFFFFFF),
        "incoming_window": UInt(incoming_window),
        "next_outgoing_id": UInt(next_outgoing_id & 0xFFFFFFFF),
        "outgoing_window": UInt(outgoing_window),
    }
