"""The log's record: the one value every layer of foldplane shares.

A record is immutable. ``offset`` is assigned by the store at durable commit (>= 1, gap-free,
strictly increasing); ``ts`` is nanoseconds from the writer's clock at append and is the only
clock the coordinator fold ever sees; ``term`` is the leadership term that fenced the append.
``checksum`` covers every other field, so a reader can tell a damaged record from a good one.

This module is pure (no I/O) so that the fold can import it.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

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


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """A durable record as read back from the log."""

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


def validate(rec: NewRecord) -> bytes:
    """Check a record before append; return its encoded payload. Raises InvalidRecord."""
    if rec.kind not in KINDS:
        raise InvalidRecord(f"unknown kind {rec.kind!r}; expected one of {sorted(KINDS)}")
    if rec.group is not None and (not isinstance(rec.group, str) or not _GROUP_RE.match(rec.group)):
        raise InvalidRecord(
            f"group {rec.group!r} is not a valid name (1-64 of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)"
        )
    if rec.rank is not None and (
        isinstance(rec.rank, bool) or not isinstance(rec.rank, int) or rec.rank < 0
    ):
        raise InvalidRecord(f"rank {rec.rank!r} must be a non-negative integer or null")
    if rec.ts is not None and (
        isinstance(rec.ts, bool) or not isinstance(rec.ts, int) or rec.ts < 0
    ):
        raise InvalidRecord(f"ts {rec.ts!r} must be non-negative integer nanoseconds")
    return encode_payload(rec.payload)


def checksum(
    offset: int, ts: int, term: int, kind: str, group: str | None, rank: int | None, payload: bytes
) -> int:
    """CRC-32 over every field of a record, in a fixed layout."""
    head = f"{offset}\x1f{ts}\x1f{term}\x1f{kind}\x1f{group or ''}\x1f{'' if rank is None else rank}\x1e"
    return zlib.crc32(payload, zlib.crc32(head.encode()))
