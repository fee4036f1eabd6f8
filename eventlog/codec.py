"""Turning stored rows back into records, verifying each one's checksum on the way.

This is the replay hot path (hundreds of thousands of rows a second), so the checksum layout of
``record.checksum`` is inlined here rather than called per row; ``test_codec.py`` pins the two
together.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from zlib import crc32

import msgspec

from eventlog.errors import ChecksumError
from eventlog.record import Record, checksum, checksum_tail, head_packer

#: Column order every store selects: seq, ts_ns, term, kind, grp, rank, payload, crc.
COLUMNS = "seq, ts_ns, term, kind, grp, rank, payload, crc"

_decode = msgspec.json.Decoder(dict).decode
_head = head_packer()


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a page of rows is fetched and decoded.

    A page allocates tens of thousands of container objects (row tuples, payload dicts) and
    creates no reference cycles: refcounting frees all of it. Left on, the collector would
    run a generation-0 pass every 700 of those allocations and scan them all for nothing,
    which costs replay about a fifth of its time. Collection is deferred, not skipped: the
    allocation count carries over, so the first allocation after the page collects. Nested
    and concurrent pauses (reader threads, the event loop) share one pause; the collector
    comes back on when the last one ends, if it was on when the first began.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def decode_rows(rows: Iterable[Any]) -> list[Record]:
    """Verify and decode rows in ``COLUMNS`` order; a damaged row raises ChecksumError.

    Nothing is skipped: a reader either gets every record it asked for, intact, or an error
    that names the first damaged offset.

    The checksum is ``record.checksum``'s layout computed in one CRC call per row: a page holds
    few distinct ``(kind, group)`` pairs, so their encoded bytes and lengths are looked up, not
    re-encoded, and CRC-32 over ``head + kind + group + payload`` equals the chained CRC over
    the parts.
    """
    with gc_paused():
        return _decode_rows(rows)


def _decode_rows(rows: Iterable[Any]) -> list[Record]:
    out: list[Record] = []
    append = out.append
    # (kind, group) -> checksum tail, its two lengths, and one shared copy of the two strings
    tails: dict[tuple[Any, Any], tuple[bytes, int, int, Any, Any]] = {}
    last_kind = last_grp = None
    tail, klen, glen = b"", 0, 0
    for seq, ts, term, kind, grp, rank, payload, crc in rows:
        try:
            if kind != last_kind or grp != last_grp:  # runs of one kind are the common case
                known = tails.get((kind, grp))
                if known is None:
                    known = tails[kind, grp] = (*checksum_tail(kind, grp), kind, grp)
                tail, klen, glen, last_kind, last_grp = known
            head = _head(seq, ts, term, -1 if rank is None else rank, klen, glen)
            if crc32(head + tail + payload) != crc:
                _explain(seq, ts, term, kind, grp, rank, payload, crc)
            append(Record(seq, ts, term, last_kind, last_grp, rank, _decode(payload), crc))
        except ChecksumError:
            raise
        except Exception:
            _explain(seq, ts, term, kind, grp, rank, payload, crc)
            raise  # _explain always raises; this keeps type checkers content
    return out


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
