"""Frames: what the writers store decodes back to the record, and any change to a frame is
reported with its row's offset, alone or in the middle of a page."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.eventlog import ChecksumError, NewRecord, open_log
from foldplane.eventlog.codec import decode_rows
from foldplane.eventlog.record import FRAME_TAIL, Record, checksum, encode_payload, frame_body, seal

fields = st.tuples(
    st.integers(min_value=1, max_value=2**62),
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**31),
    st.sampled_from(["join", "tick", "links"]),
    st.none() | st.sampled_from(["train", "g.1", "A-b_c"]),
    st.none() | st.integers(min_value=0, max_value=2**31 - 1),
    st.dictionaries(
        st.text(max_size=5),
        st.integers() | st.text(max_size=5) | st.none() | st.lists(st.booleans(), max_size=2),
        max_size=3,
    ),
)


def frame_of(
    seq: int, ts: int, term: int, kind: str, grp: str | None, rank: int | None, payload: dict
) -> bytes:
    return seal(frame_body(seq, ts, term, kind, grp, rank, encode_payload(payload)))[0]


@settings(max_examples=300, deadline=None)
@given(row=fields)
def test_a_frame_decodes_to_its_record(row: tuple) -> None:
    seq, ts, term, kind, grp, rank, payload = row
    frame = frame_of(*row)
    crc = checksum(seq, ts, term, kind, grp, rank, encode_payload(payload))
    assert int(frame[-FRAME_TAIL + 1 : -1]) == crc
    (rec,) = decode_rows([(seq, frame)])
    assert rec == Record(seq, ts, term, kind, grp, rank, payload, crc)
    assert msgspec.json.decode(frame) == [seq, ts, term, kind, grp, rank, payload, crc]


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(fields, min_size=3, max_size=3), victim=st.integers(0, 2))
def test_every_single_bit_flip_is_reported_with_the_offset(rows: list[tuple], victim: int) -> None:
    rows = [(i + 1, *row[1:]) for i, row in enumerate(rows)]
    page = [(row[0], frame_of(*row)) for row in rows]
    seq, frame = page[victim]
    for at in range(len(frame)):
        for bit in range(8):
            damaged = bytearray(frame)
            damaged[at] ^= 1 << bit
            broken = list(page)
            broken[victim] = (seq, bytes(damaged))
            with pytest.raises(ChecksumError, match=f"record at offset {seq} is damaged") as caught:
                decode_rows(broken)
            assert caught.value.offset == seq
            with pytest.raises(ChecksumError, match=f"record at offset {seq} is damaged"):
                decode_rows([(seq, bytes(damaged))])


def test_the_page_before_a_damaged_row_is_not_the_error() -> None:
    rows = [(i, frame_of(i, i, 1, "tick", None, None, {})) for i in range(1, 6)]
    assert [r.offset for r in decode_rows(rows)] == [1, 2, 3, 4, 5]
    frame = rows[3][1]
    rows[3] = (4, frame[:-2] + b"%d]" % ((int(frame[-2:-1]) + 1) % 10))
    with pytest.raises(ChecksumError, match="record at offset 4 is damaged: stored checksum"):
        decode_rows(rows)


def test_a_frame_in_the_wrong_row_is_reported() -> None:
    frame = frame_of(3, 1, 1, "tick", None, None, {})
    with pytest.raises(
        ChecksumError, match="offset 4 is damaged: its frame holds the record of offset 3"
    ):
        decode_rows([(4, frame)])


def test_a_frame_that_is_not_json_but_matches_its_checksum_is_reported() -> None:
    frame = seal(b'[9,1,1,"tick",null,null,{not json')[0]
    with pytest.raises(ChecksumError, match="offset 9 is damaged: its frame does not decode"):
        decode_rows([(9, frame)])


def test_a_frame_of_the_wrong_type_is_reported() -> None:
    with pytest.raises(
        ChecksumError, match="offset 2 is damaged: its frame is NoneType, not bytes"
    ):
        decode_rows([(1, frame_of(1, 1, 1, "tick", None, None, {})), (2, None)])


async def test_the_sqlite_writer_stores_the_frame_record_describes(tmp_path: Path) -> None:
    """The writer thread builds frames inline; they must be ``seal(frame_body(...))``."""
    path = tmp_path / "log.db"
    log = await open_log(path)
    try:
        recs = [
            NewRecord(kind="join", group="train", rank=3, payload={"b": 1, "a": "é"}, ts=7),
            NewRecord(kind="tick", ts=8),
        ]
        assert await log.append(recs) == [1, 2]
        term = log.term
    finally:
        await log.close()
    conn = sqlite3.connect(path)
    stored = conn.execute("SELECT seq, term, kind, grp, frame FROM log ORDER BY seq").fetchall()
    conn.close()
    assert stored == [
        (1, term, "join", "train", frame_of(1, 7, term, "join", "train", 3, {"b": 1, "a": "é"})),
        (2, term, "tick", None, frame_of(2, 8, term, "tick", None, None, {})),
    ]
