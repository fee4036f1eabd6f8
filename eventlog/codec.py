"""Turning stored frames back into records, verifying each one's checksum on the way.

This is the replay hot path (hundreds of thousands of rows a second). A row is ``(seq, frame)``
and a frame is the record's JSON array (``record.FRAME_TAIL``), so a whole page is decoded by
one msgspec call over the frames joined with commas; what is left per row is one CRC over the
frame's body and two comparisons, run as C-level ``map`` calls. Only when that page-wide pass finds something
wrong are the rows taken one at a time, to name the first damaged offset and say what is wrong
with it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter, itemgetter
from typing import Any
from zlib import crc32

import msgspec

from .errors import ChecksumError
from .record import FRAME_TAIL, Record

#: Column order every store selects.
COLUMNS = "seq, frame"

_decode_page = msgspec.json.Decoder(list[Record]).decode
_decode_one = msgspec.json.Decoder(Record).decode
_seq_of, _frame_of = itemgetter(0), itemgetter(1)
_body_of = itemgetter(slice(None, -FRAME_TAIL))  # what a frame's checksum covers
_offset_of, _checksum_of = attrgetter("offset"), attrgetter("checksum")


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


def decode_rows(rows: Sequence[Any]) -> list[Record]:
    """Verify and decode ``(seq, frame)`` rows; a damaged row raises ChecksumError.

    Nothing is skipped: a reader either gets every record it asked for, intact, or an error
    that names the first damaged offset. A row is intact when its frame decodes, the checksum
    it carries equals the CRC of its body, and the offset inside it is the row's ``seq`` (so a
    frame copied to another row is caught too).
    """
    with gc_paused():
        records = _decode_whole_page(rows)
        if records is None:
            records = [_decode_row(seq, frame) for seq, frame in rows]
        return records


def _decode_whole_page(rows: Sequence[Any]) -> list[Record] | None:
    """Every row's record, or None if anything about the page is off (then go row by row).

    The per-row checks run as ``map`` over C functions (itemgetter, crc32, attrgetter) and
    one list comparison each: a Python loop doing the same costs about 15 % more of replay.
    """
    frames = list(map(_frame_of, rows))
    try:
        records = _decode_page(b"[" + b",".join(frames) + b"]")
    except (msgspec.DecodeError, TypeError):
        return None
    if (
        len(records) != len(rows)
        or list(map(_offset_of, records)) != list(map(_seq_of, rows))
        or list(map(crc32, map(_body_of, frames))) != list(map(_checksum_of, records))
    ):
        return None
    return records


def _decode_row(seq: int, frame: Any) -> Record:
    """One row's record, or the ChecksumError that says what is wrong with it."""
    if not isinstance(frame, bytes):
        raise ChecksumError(seq, f"its frame is {type(frame).__name__}, not bytes")
    actual = crc32(frame[:-FRAME_TAIL])
    try:
        stored: int | str = int(frame[-FRAME_TAIL + 1 : -1])
    except ValueError:
        stored = repr(frame[-FRAME_TAIL:])[1:]
    if stored != actual:
        raise ChecksumError(seq, f"stored checksum {stored} but its frame gives {actual}")
    try:
        rec = _decode_one(frame)
    except msgspec.DecodeError as exc:
        raise ChecksumError(seq, f"its frame does not decode ({exc})") from None
    if rec.offset != seq:
        raise ChecksumError(seq, f"its frame holds the record of offset {rec.offset}")
    return rec
