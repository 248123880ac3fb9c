"""The storage file format: round trip, and every kind of damage detected before Arrow reads."""

from __future__ import annotations

import datetime
import decimal
import struct
import uuid
import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import batch, framed, table, values_of

from raybus._storage.framing import (
    HEADER_SIZE,
    MAGIC,
    Batches,
    FrameError,
    _schema_message,
    _write_stream,
    decode,
    encode,
    serialize,
)


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


def _writer_bytes(data: Batches) -> bytes:
    """What Arrow's own stream writer makes of ``data`` (``serialize``'s other path)."""
    sink = pa.BufferOutputStream()
    _write_stream(sink, data)
    return bytes(sink.getvalue())


_FLAT_TYPES = [pa.int8(), pa.int64(), pa.float64(), pa.binary(), pa.string(), pa.bool_()]


@settings(max_examples=150)
@given(
    st.lists(st.sampled_from(range(len(_FLAT_TYPES))), min_size=1, max_size=4),
    st.integers(min_value=1, max_value=5),
    st.booleans(),
    st.sampled_from(["table", "batch"]),
    st.data(),
)
def test_one_flat_batch_is_serialized_as_arrows_stream_writer_writes_it(
    kinds: list[int], rows: int, metadata: bool, shape: str, data: st.DataObject
) -> None:
    """``serialize`` joins a single flat batch's stream itself (schema message, batch
    message, end marker): byte for byte what the writer writes, so the log's format does not
    depend on which path wrote a record, and any Arrow reader opens it."""
    fields = [pa.field(f"c{i}", _FLAT_TYPES[k]) for i, k in enumerate(kinds)]
    schema = pa.schema(fields, metadata={"raybus": "test"} if metadata else None)
    values = {
        "int8": st.integers(-128, 127),
        "int64": st.integers(-(2**63), 2**63 - 1),
        "double": st.floats(allow_nan=False),
        "binary": st.binary(max_size=40),
        "string": st.text(max_size=20),
        "bool": st.booleans(),
    }
    columns = [
        pa.array(
            data.draw(st.lists(st.none() | values[str(f.type)], min_size=rows, max_size=rows)),
            f.type,
        )
        for f in fields
    ]
    made = pa.RecordBatch.from_arrays(columns, schema=schema)
    payload: Batches = pa.Table.from_batches([made]) if shape == "table" else made
    assert bytes(serialize(payload)) == _writer_bytes(payload)
    assert pa.ipc.open_stream(serialize(payload)).read_all().equals(pa.Table.from_batches([made]))


def _more_flat_columns() -> list[pa.Array]:
    """Columns of the flat types beyond the property test's, those this pyarrow has
    (``pyproject.toml`` allows 15; the ``uuid`` and ``json_`` extension types and binary views
    came in later releases)."""
    columns = [
        pa.array([datetime.datetime(2026, 12, 5, 18), None], pa.timestamp("us", tz="UTC")),
        pa.array([decimal.Decimal("1.23"), None], pa.decimal128(10, 2)),
        pa.array([b"large", None], pa.large_binary()),
        pa.array([b"four", None], pa.binary(4)),
        pa.array([datetime.date(2026, 12, 5), None], pa.date32()),
        pa.array([None, None], pa.null()),
    ]
    if hasattr(pa, "uuid"):  # extension types
        columns.append(pa.array([uuid.UUID(int=7).bytes, None], pa.uuid()))
    if hasattr(pa, "json_"):
        columns.append(pa.array(['{"a": 1}', None], pa.json_()))
    if hasattr(pa, "binary_view"):
        columns.append(pa.array([b"a view past twelve bytes", None], pa.binary_view()))
    return columns


@pytest.mark.parametrize(
    "column",
    _more_flat_columns(),
    ids=lambda column: str(column.type),
)
def test_the_join_writes_the_writers_bytes_for_extension_and_other_flat_types(
    column: pa.Array,
) -> None:
    """The join serves every schema without dictionaries or nesting: extension types (whose
    name travels in the field's metadata), time zones, decimals, views. Their bytes are the
    writer's too, and they read back as written."""
    data = pa.table({"c": column, "n": pa.array([1, 2], pa.int64())})
    assert _schema_message(data.schema) is not None  # joined, not the writer's path
    assert bytes(serialize(data)) == _writer_bytes(data)
    assert pa.ipc.open_stream(serialize(data)).read_all().equals(data)


def test_schemas_past_the_cache_are_joined_without_being_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first 8 schemas' messages are kept (a log's flushes have one schema, its
    checkpoints another); a schema after them is joined all the same, from a message made
    for that call, and the kept ones stay."""
    from raybus._storage import framing

    monkeypatch.setattr(framing, "_SCHEMA_MESSAGES", [])
    tables = [pa.table({f"c{i}": pa.array([i, None], pa.int64())}) for i in range(10)]
    for data in tables + tables:  # the second pass: eight from the cache, two past it
        assert bytes(serialize(data)) == _writer_bytes(data)
    kept = framing._SCHEMA_MESSAGES
    assert [schema.names for schema, _ in kept] == [[f"c{i}"] for i in range(8)]
    assert all(head == schema.serialize().to_pybytes() for schema, head in kept)


def test_data_the_join_does_not_serve_takes_the_writer() -> None:
    """Several batches, no rows, or a dictionary column: the writer's bytes, as before."""
    dictionary = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    two = pa.Table.from_batches([batch([1]), batch([2, 3])])
    for data in (two, table([]), dictionary, [batch([4]), batch([5])]):
        assert bytes(serialize(data)) == _writer_bytes(data)
    assert _schema_message(dictionary.schema) is None


def test_a_large_batch_takes_the_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Joining would copy a checkpoint's megabytes twice: past ``_JOIN_MAX_BYTES`` the writer
    serializes it (same bytes)."""
    from raybus._storage import framing

    big = pa.table({"b": pa.array([b"x" * (framing._JOIN_MAX_BYTES + 1)])})
    expected = _writer_bytes(big)

    def refuse(schema: pa.Schema) -> bytes | None:
        raise AssertionError("joined")

    monkeypatch.setattr(framing, "_schema_message", refuse)
    assert bytes(serialize(big)) == expected
    with pytest.raises(AssertionError, match="joined"):
        serialize(pa.table({"b": pa.array([b"small"])}))
