"""Turning stored rows back into records, verifying each one's checksum on the way."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eventlog.errors import ChecksumError
from eventlog.record import Record, checksum, decode_payload

#: Column order every store selects: seq, ts_ns, term, kind, grp, rank, payload, crc.
COLUMNS = "seq, ts_ns, term, kind, grp, rank, payload, crc"


def decode_rows(rows: Iterable[Any]) -> list[Record]:
    """Verify and decode rows in ``COLUMNS`` order; a damaged row raises ChecksumError.

    Nothing is skipped: a reader either gets every record it asked for, intact, or an error
    that names the first damaged offset.
    """
    out: list[Record] = []
    append = out.append
    for seq, ts, term, kind, grp, rank, payload, crc in rows:
        try:
            actual = checksum(seq, ts, term, kind, grp, rank, payload)
        except Exception as exc:  # a damaged column can even have the wrong type
            raise ChecksumError(seq, f"its fields cannot be checked ({exc})") from None
        if actual != crc:
            raise ChecksumError(seq, f"stored checksum {crc} but its fields give {actual}")
        try:
            doc = decode_payload(payload)
        except Exception as exc:
            raise ChecksumError(seq, f"its payload does not decode ({exc})") from None
        append(
            Record(
                offset=seq,
                ts=ts,
                term=term,
                kind=kind,
                group=grp,
                rank=rank,
                payload=doc,
                checksum=crc,
            )
        )
    return out
