"""The wire's rank sets: every form decodes to what was encoded, and every malformed one is
refused with a message that says what is wrong."""

from __future__ import annotations

import pytest

from foldplane.wire import ranks as rank_sets
from foldplane.wire.ranks import RankSetError


@pytest.mark.parametrize(
    ("ranks", "wire"),
    [
        ([], []),
        ([3], [3]),
        ([0, 1, 2, 3], [[0, 3]]),
        ([0, 2, 3, 4, 5, 9], [0, [2, 5], 9]),
        (range(65_536), [[0, 65_535]]),
    ],
)
def test_short_sets_are_lists_of_ranks_and_runs(ranks, wire):
    assert rank_sets.encode(ranks) == wire
    assert rank_sets.decode(wire, 65_536) == tuple(ranks)


def test_a_scattered_set_is_a_bitmap_and_decodes_back():
    ranks = list(range(0, 4096, 3))
    encoded = rank_sets.encode(ranks)
    assert isinstance(encoded, str) and encoded.startswith("b64:")
    assert rank_sets.decode(encoded, 4096) == tuple(ranks)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"0": 1}, "must be a list of ranks"),
        ([3, 1], "increasing order"),
        ([1, 1], "increasing order"),
        ([[0, 4], 3], "increasing order"),
        ([[5, 2]], "ends before it starts"),
        ([True], "neither a rank"),
        (["1"], "neither a rank"),
        ([[0, 1, 2]], "neither a rank"),
        ([8], "not ranks in 0..7"),
        ([[0, 8]], "not ranks in 0..7"),
        ([-1], "not ranks in 0..7"),
        ("0,1", "starts with 'b64:'"),
        ("b64:!!!!", "not valid base64"),
        ("b64:AAE=", "names rank 8"),
        ("b64:" + "A" * 64, "longer than the group"),
    ],
)
def test_a_malformed_set_is_refused_with_what_is_wrong(value, says):
    with pytest.raises(RankSetError, match=says):
        rank_sets.decode(value, 8, name="down")


def test_the_query_form_round_trips():
    ranks = [0, 1, 2, 3, 7, 12, 13]
    assert rank_sets.format_query(ranks) == "0-3,7,12-13"
    assert rank_sets.parse_query("0-3,7,12-13") == tuple(ranks)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "must look like"),
        ("1,\u00b2", "must look like"),  # a non-ASCII digit
        ("1;2", "must look like"),
        ("3,1", "increasing order"),
        ("1-", "neither a rank"),
        ("-1", "neither a rank"),
        ("5-2", "increasing order"),
        ("0-2000", "more than 1024 ranks"),
        ("70000", "not a rank in"),
    ],
)
def test_a_malformed_query_is_refused_with_what_is_wrong(text, says):
    with pytest.raises(RankSetError, match=says):
        rank_sets.parse_query(text)
