"""Turning stored rows back into records, verifying each one's checksum on the way.

This is the replay hot path (hundreds of thousands of rows a second), so the checksum layout of
``record.checksum`` is inlined here rather than called per row; ``test_codec.py`` pins the two
together.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any
from zlib import crc32

import msgspec

from eventlog.errors import ChecksumError
from eventlog.record import Record, checksum

#: Column order every store selects: seq, ts_ns, term, kind, grp, rank, payload, crc.
COLUMNS = "seq, ts_ns, term, kind, grp, rank, payload, crc"

_decode = msgspec.json.Decoder(dict).decode
_head = struct.Struct("<qqqqHH").pack


def decode_rows(rows: Iterable[Any]) -> list[Record]:
    """Verify and decode rows in ``COLUMNS`` order; a damaged row raises ChecksumError.

    Nothing is skipped: a reader either gets every record it asked for, intact, or an error
    that names the first damaged offset.

    The checksum is ``record.checksum``'s layout computed in two C calls per row: a page holds
    few distinct ``(kind, group)`` pairs, so their encoded bytes and lengths are looked up, not
    re-encoded, and CRC-32 over ``head + kind + group`` equals the chained CRC over the parts.
    """
    out: list[Record] = []
    append = out.append
    tails: dict[tuple[Any, Any], tuple[bytes, int, int]] = {}
    for seq, ts, term, kind, grp, rank, payload, crc in rows:
        try:
            try:
                tail, klen, glen = tails[kind, grp]
            except KeyError:
                tail, klen, glen = tails[kind, grp] = _tail(kind, grp)
            head = _head(seq, ts, term, -1 if rank is None else rank, klen, glen)
            if crc32(payload, crc32(head + tail)) != crc:
                _explain(seq, ts, term, kind, grp, rank, payload, crc)
            doc = _decode(payload)
        except ChecksumError:
            raise
        except Exception:
            _explain(seq, ts, term, kind, grp, rank, payload, crc)
            raise  # _explain always raises; this keeps type checkers content
        append(Record(seq, ts, term, kind, grp, rank, doc, crc))
    return out


def _tail(kind: str, grp: str | None) -> tuple[bytes, int, int]:
    """The kind and group bytes that follow the packed header, and their header lengths."""
    k = kind.encode()
    if grp is None:
        return k, len(k), 0xFFFF
    g = grp.encode()
    return k + g, len(k), len(g)


def _explain(
    seq: int, ts: Any, term: Any, kind: Any, grp: Any, rank: Any, payload: Any, crc: Any
) -> None:
    """Raise the ChecksumError that says what is wrong with the row at ``seq``."""
    try:
        actual = checksum(seq, ts, term, kind, grp, rank, payload)
    except Exception as exc:  # a damaged column can even have the wrong type
        raise ChecksumError(seq, f"its fields cannot be checked ({exc})") from None
    if actual != crc:
        raise ChecksumError(seq, f"stored checksum {crc} but its fields give {actual}")
    try:
        _decode(payload)
    except Exception as exc:
        raise ChecksumError(seq, f"its payload does not decode ({exc})") from None
    raise ChecksumError(seq, "it cannot be read")
