"""Projections: derived documents kept beside the log (views, proposal outcomes).

A projection row is never the source of truth: replaying the log rebuilds it. It is written
together with the consumer offset that produced it, so "rows written" and "offset processed"
cannot diverge after a crash.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .record import InvalidRecord

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(dict)


class ProjectionRow(msgspec.Struct, frozen=True):
    """One derived document, keyed by ``(kind, group, seq)``; e.g. ``("view", "train", 3, {...})``."""

    kind: str
    group: str
    seq: int
    doc: dict[str, Any]


def encode_projection(index: int, row: ProjectionRow) -> bytes:
    """Check one row and return its encoded document; InvalidRecord names the index and field."""
    if not isinstance(row, ProjectionRow):
        raise InvalidRecord(
            f"projection {index}: expected a ProjectionRow, got {type(row).__name__}"
        )
    if not isinstance(row.kind, str) or not row.kind:
        raise InvalidRecord(f"projection {index}: kind {row.kind!r} must be a non-empty string")
    if not isinstance(row.group, str) or not row.group:
        raise InvalidRecord(f"projection {index}: group {row.group!r} must be a non-empty string")
    if isinstance(row.seq, bool) or not isinstance(row.seq, int) or row.seq < 0:
        raise InvalidRecord(f"projection {index}: seq {row.seq!r} must be a non-negative integer")
    if not isinstance(row.doc, dict):
        raise InvalidRecord(
            f"projection {index}: doc must be a JSON object, got {type(row.doc).__name__}"
        )
    try:
        return _encoder.encode(row.doc)
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise InvalidRecord(f"projection {index}: doc is not JSON-serializable: {exc}") from None


def decode_projection(kind: str, group: str, seq: int, doc: bytes) -> ProjectionRow:
    return ProjectionRow(kind, group, seq, _decoder.decode(doc))
