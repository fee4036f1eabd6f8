"""The read path's inlined checksum agrees with ``record.checksum`` and rejects any change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import ChecksumError
from eventlog.codec import decode_rows
from eventlog.record import checksum, encode_payload

rows = st.tuples(
    st.integers(min_value=1, max_value=2**62),
    st.integers(min_value=0, max_value=2**62),
    st.integers(min_value=0, max_value=2**31),
    st.sampled_from(["join", "tick", "links"]),
    st.none() | st.sampled_from(["train", "g.1"]),
    st.none() | st.integers(min_value=0, max_value=4096),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(row=rows, field=st.integers(min_value=0, max_value=6))
def test_inlined_checksum_matches_record_checksum(row: tuple, field: int) -> None:
    seq, ts, term, kind, grp, rank, payload = row
    data = encode_payload(payload)
    crc = checksum(seq, ts, term, kind, grp, rank, data)
    (rec,) = decode_rows([(seq, ts, term, kind, grp, rank, data, crc)])
    assert (rec.offset, rec.payload, rec.checksum) == (seq, payload, crc)

    damaged = list((seq, ts, term, kind, grp, rank, data, crc))
    damaged[field] = {
        0: seq + 1,
        1: ts + 1,
        2: term + 1,
        3: kind + "x",
        4: "other" if grp is None else None,
        5: 0 if rank is None else None if rank == 0 else rank - 1,
        6: data + b" ",
    }[field]
    with pytest.raises(ChecksumError, match=f"record at offset {damaged[0]} is damaged"):
        decode_rows([tuple(damaged)])


def test_undecodable_payload_with_matching_checksum_is_reported() -> None:
    data = b"{not json"
    crc = checksum(9, 1, 1, "tick", None, None, data)
    with pytest.raises(ChecksumError, match="offset 9 is damaged: its payload does not decode"):
        decode_rows([(9, 1, 1, "tick", None, None, data, crc)])
