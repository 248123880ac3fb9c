"""How many records cross one actor call: in pieces that Ray can carry inside the call.

Ray passes an argument or a result of up to 100 KiB (its ``max_direct_call_object_size``)
inside the call's own message, and anything larger through the object store: the caller puts
it there, the callee fetches it through its raylet. Measured here (a Ray actor, pipelined
calls, the default threshold), a 200 KiB argument costs 1.16 ms of wall time per call as one
object and 0.44 ms as three; a 200 KiB result 1.02 ms as one and 0.39 ms as three, with about
half the CPU on both sides. A batch of 100 messages of 1 KiB is just over the threshold, so
that is the common case, not a corner.

Records therefore travel in pieces of at most about ``INLINE_BYTES`` each, one positional
argument (or one return value) per piece, each small enough to stay inline. Splitting stops
paying past about 400 KiB a call (measured: 400 KiB as five inline pieces 0.92 ms, as one
object 1.20 ms; the object store's cost is mostly per object, so several pieces each too big
to stay inline would cost several times one). A call of more than ``MAX_PIECES`` pieces'
worth therefore goes as ONE piece, through the object store, as it did before.

Sizes are estimates: a row's encoded message size (``MessageRecord.size``, computed once at
the sender) plus a fixed allowance for the tuple and the broker's fields. A piece that turns
out larger than estimated only costs the object store's round trip; nothing depends on it.
"""

from __future__ import annotations

import pickle
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate, chain
from typing import Any

from .record import MessageRecord, WireRecord, to_wire, wire_sizes

__all__ = [
    "INLINE_BYTES",
    "MAX_PIECES",
    "PickledPieces",
    "join_groups",
    "pack_rows",
    "pickle_pieces",
    "pieces_for",
    "send_args",
    "split_groups",
    "split_rows",
    "unpack_rows",
]

INLINE_BYTES = 80 * 1024  # under Ray's default 100 KiB, with room for the estimate's error
MAX_PIECES = 6


def pieces_for(total_bytes: int) -> int:
    """How many pieces ``total_bytes`` of rows cross in: enough for each to stay inline, or
    one (through the object store) when that would take more than ``MAX_PIECES``."""
    n = -(-total_bytes // INLINE_BYTES)
    return n if 1 < n <= MAX_PIECES else 1


def split_rows(rows: Sequence[WireRecord], pieces: int) -> list[list[WireRecord]]:
    """``rows`` in order, cut into exactly ``pieces`` consecutive lists of about equal
    estimated size (some may be empty)."""
    return _cut(rows, wire_sizes(rows) if pieces > 1 else [], pieces)


def _cut(rows: Sequence[WireRecord], sizes: list[int], pieces: int) -> list[list[WireRecord]]:
    """A row goes to the piece its middle byte falls in (``sizes``: the rows' estimated
    sizes), so pieces stay about equal. The borders are found by bisection over the running
    sizes, not by a Python step per row (that step was 5 % of a sender's CPU in the e2e
    profile)."""
    if pieces <= 1:
        return [list(rows)]
    ends = list(accumulate(sizes))
    total = ends[-1] if ends else 0
    if not total:
        return [list(rows)] + [[] for _ in range(pieces - 1)]
    # Row i's middle byte is at ends[i] - sizes[i] / 2; piece k starts at the first row whose
    # middle is at or past k * total / pieces. In integers (both sides times 2 * pieces): exact.
    middles = [pieces * (2 * end - size) for end, size in zip(ends, sizes, strict=True)]
    borders = [0, *(bisect_left(middles, 2 * k * total) for k in range(1, pieces)), len(rows)]
    return [list(rows[borders[k] : borders[k + 1]]) for k in range(pieces)]


def split_groups(groups: Sequence[Sequence[WireRecord]]) -> tuple[Any, ...]:
    """The arguments that carry ``groups`` (each an atomic batch of rows): the groups'
    lengths, then the rows of all groups in order, in pieces (``join_groups`` undoes it)."""
    layout = [len(g) for g in groups]
    rows = list(chain.from_iterable(groups))
    sizes = wire_sizes(rows)
    return (layout, *_cut(rows, sizes, pieces_for(sum(sizes))))


def send_args(groups: Sequence[Sequence[MessageRecord]]) -> tuple[Any, ...]:
    """The arguments of a ``send_groups`` or ``publish`` call carrying ``groups`` of records
    (each an atomic batch)."""
    return split_groups([to_wire(g) for g in groups])


def join_groups(layout: Sequence[int], pieces: Sequence[Sequence[WireRecord]]) -> list[list[Any]]:
    """The groups ``split_groups`` cut into ``layout`` and ``pieces``.

    Raises ``ValueError`` when the pieces do not hold exactly the rows the layout names (a
    malformed call: nothing of it may be stored)."""
    rows = list(chain.from_iterable(pieces))
    if any(n < 0 for n in layout) or sum(layout) != len(rows):
        raise ValueError(
            f"a call named {sum(layout)} records in {len(layout)} groups but carried {len(rows)}"
        )
    groups: list[list[Any]] = []
    start = 0
    for n in layout:
        groups.append(rows[start : start + n])
        start += n
    return groups


def pack_rows(rows: Sequence[WireRecord]) -> list[bytes]:
    """``rows`` pickled ONCE, cut into pieces of bytes that stay inline (one piece past
    ``MAX_PIECES``' worth). For rows sent unchanged to many actors (a topic's copies to every
    subscription partition): Ray would pickle the rows again for every call, which was two
    thirds of the router's CPU (py-spy); bytes cost it a copy."""
    blob = pickle.dumps(list(rows), protocol=pickle.HIGHEST_PROTOCOL)
    n = pieces_for(len(blob))
    if n == 1:
        return [blob]
    step = -(-len(blob) // n)
    return [blob[i : i + step] for i in range(0, len(blob), step)]


def unpack_rows(pieces: Sequence[bytes]) -> list[WireRecord]:
    """The rows ``pack_rows`` cut into ``pieces``."""
    rows: list[WireRecord] = pickle.loads(pieces[0] if len(pieces) == 1 else b"".join(pieces))
    return rows


class PickledPieces(list[bytes]):
    """A pickle as the pieces the pickler wrote (``pickle_pieces``): its frames, and each long
    ``bytes`` object (a message body) as that object itself, not a copy. Joined, they are
    exactly ``pickle.dumps(obj, protocol=5)``."""

    def write(self, data: Any) -> None:
        # Anything but bytes (a bytearray, which could change before it is used) is copied.
        self.append(data if data.__class__ is bytes else bytes(data))


def pickle_pieces(obj: Any) -> PickledPieces:
    """``obj`` pickled (protocol 5) without copying its long ``bytes`` objects.

    ``pickle.dumps`` copies every body into one buffer it grows as it goes: 5.5-9.6 ms for a
    list of 100 bodies of 64 KiB on this machine, against 0.1 ms here (a pickler writing to a
    file hands a long bytes object to ``write`` as it is). About 1 us more for a short
    object."""
    pieces = PickledPieces()
    pickle.Pickler(pieces, protocol=5).dump(obj)
    return pieces
