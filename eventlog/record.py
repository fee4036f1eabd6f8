"""The log's record: the one value every layer of foldplane shares.

A record is immutable. ``offset`` is assigned by the store at durable commit (>= 1, gap-free,
strictly increasing); ``ts`` is nanoseconds from the writer's clock at append and is the only
clock the coordinator fold ever sees; ``term`` is the leadership term that fenced the append.
``checksum`` covers every other field, so a reader can tell a damaged record from a good one.

This module is pure (no I/O) so that the fold can import it.
"""

from __future__ import annotations

import re
import struct
from typing import Any
from zlib import crc32

import msgspec

#: Every kind of input the log accepts. Views and proposal outcomes are *derived* (projections),
#: never appended.
KINDS: frozenset[str] = frozenset(
    {
        "group_created",
        "join",
        "heartbeat",
        "links",
        "ack",
        "exit",
        "death_reported",
        "proposal",
        "tick",
    }
)

#: The largest encoded payload a single record may carry.
MAX_PAYLOAD_BYTES = 64 * 1024

#: Records per ``Log.read`` for a long scan (a replay, a restart's tail): large enough that a
#: page's fixed cost (one query, one hop to the reader thread and back) is spread thin, small
#: enough that a page's rows and records stay in the CPU caches while they are decoded
#: (10,000 was a few percent slower here).
READ_PAGE = 5000

_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(dict)


class InvalidRecord(ValueError):
    """A record was refused before anything was written; the message names the field."""


class NewRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller appends; the store assigns ``offset``, ``term`` and (if absent) ``ts``."""

    kind: str
    group: str | None = None
    rank: int | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    ts: int | None = None


class Record(msgspec.Struct, frozen=True, gc=False):
    """A durable record as read back from the log.

    Fields may be given by position (the replay path builds millions of these); the struct is
    not tracked by the garbage collector, which would otherwise rescan every record of a page.
    """

    offset: int
    ts: int
    term: int
    kind: str
    group: str | None
    rank: int | None
    payload: dict[str, Any]
    checksum: int


def encode_payload(payload: Any) -> bytes:
    """Canonical JSON bytes of a payload (sorted keys), or InvalidRecord naming the problem."""
    if not isinstance(payload, dict):
        raise InvalidRecord(f"payload must be a JSON object, got {type(payload).__name__}")
    try:
        data = _encoder.encode(payload)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise InvalidRecord(f"payload is not JSON-serializable: {exc}") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidRecord(
            f"payload is {len(data)} bytes encoded; the limit is {MAX_PAYLOAD_BYTES} bytes"
        )
    return data


def decode_payload(data: bytes) -> dict[str, Any]:
    return _decoder.decode(data)


#: Bounds the columns can hold: ``rank`` is a 32-bit integer, ``ts`` a signed 64-bit one.
MAX_RANK = 2**31 - 1
MAX_TS = 2**63 - 1


class Encoded(msgspec.Struct, frozen=True, gc=False):
    """A record whose payload a caller already encoded with :func:`validate` (the coordinator
    validates each input on arrival, to answer a bad one alone). ``Log.append`` takes it
    without encoding the payload again; its other fields are still checked there. Build it only
    from ``validate(record)``'s result for that record's payload."""

    record: NewRecord
    payload: bytes


def validate(rec: NewRecord) -> bytes:
    """Check a record before append; return its encoded payload. Raises InvalidRecord.

    Everything a store could refuse is refused here, before the record joins a batch: a bad
    record must fail alone, never the other callers' records committed with it.

    Every append passes through here, so the common case (a known kind, a group name seen
    before, plain ints) is decided by a few identity and set tests; anything else takes the
    full checks below, which also word the errors.
    """
    validate_fields(rec)
    return encode_payload(rec.payload)


def validate_fields(rec: NewRecord) -> None:
    """:func:`validate` without the payload: kind, group, rank and ts. Raises InvalidRecord."""
    kind, group, rank, ts = rec.kind, rec.group, rec.rank, rec.ts
    if not (
        type(kind) is str
        and kind in KINDS
        and (group is None or (type(group) is str and group in _good_groups))
        and (rank is None or (type(rank) is int and 0 <= rank <= MAX_RANK))
        and (ts is None or (type(ts) is int and 0 <= ts <= MAX_TS))
    ):
        _check_fields(kind, group, rank, ts)


#: Group names already found valid (the regex runs once per name, not once per record);
#: emptied when it grows past ``_GOOD_GROUPS_MAX`` so a stream of new names cannot grow it.
_good_groups: set[str] = set()
_GOOD_GROUPS_MAX = 4096


def _check_fields(kind: Any, group: Any, rank: Any, ts: Any) -> None:
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidRecord(f"unknown kind {kind!r}; expected one of {sorted(KINDS)}")
    if group is not None:
        if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
            raise InvalidRecord(
                f"group {group!r} is not a valid name (1-64 of A-Z a-z 0-9 . _ -, "
                "starting with a letter or digit)"
            )
        if type(group) is str:
            if len(_good_groups) >= _GOOD_GROUPS_MAX:
                _good_groups.clear()
            _good_groups.add(group)
    if rank is not None and (
        isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK
    ):
        raise InvalidRecord(
            f"rank {rank!r} must be a non-negative integer up to {MAX_RANK}, or null"
        )
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= MAX_TS
    ):
        raise InvalidRecord(f"ts {ts!r} must be non-negative integer nanoseconds below 2**63")


# offset, ts, term, rank (-1: null), byte lengths of kind and group (0xFFFF: null group)
_HEAD = struct.Struct("<qqqqHH")


def head_packer() -> Any:
    """``pack(offset, ts, term, rank or -1, kind length, group length or 0xFFFF)``: the header
    of ``checksum``'s layout, for hot paths that compute it inline."""
    return _HEAD.pack


def checksum_tail(kind: str, group: str | None) -> tuple[bytes, int, int]:
    """The bytes after the header in ``checksum``'s layout (kind, then group) and the two
    lengths the header carries. Hot paths compute ``crc32(head + tail + payload)`` with it,
    looking the tail up per ``(kind, group)`` instead of encoding both for every record."""
    k = kind.encode()
    if group is None:
        return k, len(k), 0xFFFF
    g = group.encode()
    return k + g, len(k), len(g)


def checksum(
    offset: int, ts: int, term: int, kind: str, group: str | None, rank: int | None, payload: bytes
) -> int:
    """CRC-32 over every field of a record, in a fixed layout.

    The layout is a packed header (offset, ts, term, rank and the lengths of kind and group,
    so no two records share a byte stream), then kind, group and the payload bytes. Binary
    packing keeps it cheap: replay verifies every record it reads.
    """
    k = kind.encode()
    g = b"" if group is None else group.encode()
    head = _HEAD.pack(
        offset, ts, term, -1 if rank is None else rank, len(k), 0xFFFF if group is None else len(g)
    )
    return crc32(payload, crc32(g, crc32(k, crc32(head))))
