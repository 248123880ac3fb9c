"""The storage file format: round trip, and every kind of damage detected before Arrow reads."""

from __future__ import annotations

import struct
import zlib

import pyarrow as pa
import pytest
from storage_helpers import batch, framed, table, values_of

from raybus._storage.framing import HEADER_SIZE, MAGIC, Batches, FrameError, decode, encode


def test_header_layout_is_magic_length_crc() -> None:
    header, payload = encode(table([1, 2, 3]))
    magic, length, crc = struct.unpack("<8sQI", header)
    assert (magic, HEADER_SIZE) == (MAGIC, len(header))
    assert length == payload.size
    assert crc == zlib.crc32(payload.to_pybytes())
    # The payload is a plain Arrow IPC stream any Arrow reader opens.
    assert values_of(pa.ipc.open_stream(payload).read_all()) == [1, 2, 3]


@pytest.mark.parametrize(
    "data",
    [table([1, 2]), batch([3]), [batch([4]), batch([5, 6])], table([])],
    ids=["table", "batch", "batches", "empty-table"],
)
def test_round_trip(data: Batches) -> None:
    if isinstance(data, pa.Table):
        expected = data
    else:
        expected = pa.Table.from_batches(data if isinstance(data, list) else [data])
    header, payload = encode(data)
    assert decode(header + payload.to_pybytes()).equals(expected)


def test_empty_batch_list_and_mixed_schemas_are_refused() -> None:
    with pytest.raises(ValueError):
        encode([])
    with pytest.raises(ValueError):
        encode([batch([1]), pa.record_batch({"w": ["x"]})])
    with pytest.raises(TypeError):
        encode([table([1])])


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda b: b[:10], "shorter than"),
        (lambda b: b[:-1], "announces"),
        (lambda b: b + b"\x00", "announces"),
        (lambda b: b"XXXXXXXX" + b[8:], "magic"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC"),
        (lambda b: b[:16] + bytes([b[16] ^ 1]) + b[17:], "CRC"),
    ],
    ids=["short-header", "torn", "trailing-garbage", "magic", "payload-bit", "crc-bit"],
)
def test_damage_is_detected(mangle: object, reason: str) -> None:
    good = framed([1, 2, 3])
    with pytest.raises(FrameError, match=reason):
        decode(mangle(good))  # type: ignore[operator]


def test_intact_frame_around_a_non_arrow_payload_is_rejected() -> None:
    payload = b"not an arrow stream"
    data = struct.pack("<8sQI", MAGIC, len(payload), zlib.crc32(payload)) + payload
    with pytest.raises(FrameError, match="Arrow"):
        decode(data)
