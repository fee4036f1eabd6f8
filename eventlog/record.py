"""The log's record: the one value every layer of foldplane shares.

A record is immutable. ``offset`` is assigned by the store at durable commit (>= 1, gap-free,
strictly increasing); ``ts`` is nanoseconds from the writer's clock at append and is the only
clock the coordinator fold ever sees; ``term`` is the leadership term that fenced the append.
``checksum`` covers every other field, so a reader can tell a damaged record from a good one.

This module is pure (no I/O) so that the fold can import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from zlib import crc32

import msgspec

#: The kinds of input of membership, which the log accepts from the start. Views and proposal
#: outcomes are *derived* (projections), never appended.
MEMBERSHIP_KINDS: frozenset[str] = frozenset(
    {
        "group_created",
        "group_ended",
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

#: What a log accepts unless its opener names more (``Log.kinds``): membership's. Whoever
#: composes the facets hands the log theirs beside it (``coordinator.fold.registry.Facets``);
#: the log does not know the facets, and refuses any kind it was not given.
KINDS: frozenset[str] = MEMBERSHIP_KINDS


def check_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """``kinds`` as a set a log may accept, each a name of ``[a-z_]``; a ValueError otherwise."""
    kinds = frozenset(kinds)
    for kind in kinds:
        if not (isinstance(kind, str) and _KIND_RE.fullmatch(kind)):
            raise ValueError(f"record kind {kind!r} is not a name of 1-32 of a-z and _")
    return kinds


#: The largest encoded payload a single record may carry.
MAX_PAYLOAD_BYTES = 64 * 1024

#: Records per ``Log.read`` for a long scan (a replay, a restart's tail): large enough that a
#: page's fixed cost (one query, one hop to the reader thread and back) is spread thin, small
#: enough that a page's rows and records stay in the CPU caches while they are decoded
#: (10,000 was a few percent slower here).
READ_PAGE = 5000

_KIND_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
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


class Record(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """A durable record as read back from the log.

    Fields may be given by position (the replay path builds millions of these); the struct is
    not tracked by the garbage collector, which would otherwise rescan every record of a page.
    It is ``array_like``: msgspec reads and writes it as the JSON array of its fields, the
    layout of the stored frame (see ``FRAME_TAIL``), so a page of frames decodes into records
    in one call. Surfaces that show records to people (the HTTP API, the event stream) spell
    the fields out by name.
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


def validate(rec: NewRecord, kinds: frozenset[str] = KINDS) -> bytes:
    """Check a record before append; return its encoded payload. Raises InvalidRecord.

    Everything a store could refuse is refused here, before the record joins a batch: a bad
    record must fail alone, never the other callers' records committed with it.

    Every append passes through here, so the common case (a known kind, a group name seen
    before, plain ints) is decided by a few identity and set tests; anything else takes the
    full checks below, which also word the errors.
    """
    validate_fields(rec, kinds)
    return encode_payload(rec.payload)


def validate_fields(rec: NewRecord, kinds: frozenset[str] = KINDS) -> None:
    """:func:`validate` without the payload: kind (one of ``kinds``), group, rank and ts.
    Raises InvalidRecord."""
    kind, group, rank, ts = rec.kind, rec.group, rec.rank, rec.ts
    if not (
        type(kind) is str
        and kind in kinds
        and (group is None or (type(group) is str and group in _good_groups))
        and (rank is None or (type(rank) is int and 0 <= rank <= MAX_RANK))
        and (ts is None or (type(ts) is int and 0 <= ts <= MAX_TS))
    ):
        _check_fields(kinds, kind, group, rank, ts)


#: Group names already found valid (the regex runs once per name, not once per record);
#: emptied when it grows past ``_GOOD_GROUPS_MAX`` so a stream of new names cannot grow it.
_good_groups: set[str] = set()
_GOOD_GROUPS_MAX = 4096


def _check_fields(kinds: frozenset[str], kind: Any, group: Any, rank: Any, ts: Any) -> None:
    if not isinstance(kind, str) or kind not in kinds:
        raise InvalidRecord(f"unknown kind {kind!r}; expected one of {sorted(kinds)}")
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


#: The stored form of a record, its *frame*, is the record as a JSON array in field order,
#: ``[offset,ts,term,"kind","group",rank,{payload},checksum]``, with the checksum written as ten
#: characters (right-aligned, padded with spaces) so the frame always ends in exactly
#: ``FRAME_TAIL`` bytes after what the checksum covers. The checksum is CRC-32 over every byte
#: before that tail: all the other fields, the payload as its canonical bytes. A frame decodes
#: straight into a :class:`Record` (which is ``array_like``), and a page of frames joined with
#: commas decodes in one call, which is what makes replay cheap.
FRAME_TAIL = len(b",%10d]" % 0)

#: ``"kind","group",`` (each JSON-encoded and followed by a comma) per (kind, group) seen; emptied
#: when it grows past ``_GOOD_GROUPS_MAX``, like ``_good_groups``.
_names: dict[tuple[str, str | None], bytes] = {}


def frame_names(kind: str, group: str | None) -> bytes:
    """The frame's bytes for ``kind`` and ``group`` with the commas after them, looked up."""
    try:
        return _names[kind, group]
    except KeyError:
        if len(_names) >= _GOOD_GROUPS_MAX:
            _names.clear()
        names = _names[kind, group] = b"%s,%s," % (_encoder.encode(kind), _encoder.encode(group))
        return names


def frame_body(
    offset: int, ts: int, term: int, kind: str, group: str | None, rank: int | None, payload: bytes
) -> bytes:
    """The bytes of a record's frame that its checksum covers (everything but the tail)."""
    return b"[%d,%d,%d,%s%s,%s" % (
        offset,
        ts,
        term,
        frame_names(kind, group),
        b"null" if rank is None else b"%d" % rank,
        payload,
    )


def seal(body: bytes) -> tuple[bytes, int]:
    """A whole frame from its body: ``(frame, checksum)``."""
    crc = crc32(body)
    return body + b",%10d]" % crc, crc


def checksum(
    offset: int, ts: int, term: int, kind: str, group: str | None, rank: int | None, payload: bytes
) -> int:
    """CRC-32 over every field of a record: over its frame's body (see ``FRAME_TAIL``)."""
    return crc32(frame_body(offset, ts, term, kind, group, rank, payload))
