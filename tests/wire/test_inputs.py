"""The links check's set-based fast path decides exactly what the rank-by-rank check decides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.wire.inputs import _check_each_peer
from foldplane.wire.inputs import _check_links as check_links

WORLD = 16

keys = st.sampled_from([str(r) for r in range(WORLD)]) | st.sampled_from(
    ["007", "16", "-1", "x", "", " 3", "١"]  # padded, out of range, not a number, Arabic-Indic one
)
values = st.sampled_from(["up", "down"]) | st.sampled_from(["UP", "", "sideways"])
peers = st.dictionaries(keys, values, max_size=12) | st.dictionaries(
    st.integers(-2, WORLD + 2), values, max_size=3
)


@settings(max_examples=400, deadline=None)
@given(peers=peers)
def test_the_fast_path_agrees_with_the_rank_by_rank_check(peers: dict) -> None:
    payload = {"incarnation": "i", "self_ready": True, "peers": peers}
    assert check_links(payload, WORLD) == _check_each_peer(peers, WORLD)


def test_an_unhashable_status_is_named() -> None:
    payload = {"incarnation": "i", "self_ready": True, "peers": {"1": ["up"]}}
    assert check_links(payload, WORLD) == "peers['1'] must be 'up' or 'down', got ['up']"


def test_a_full_report_of_a_large_group_is_accepted() -> None:
    peers = {str(r): "up" for r in range(1, 8192)}
    peers["5"] = "down"
    assert check_links({"incarnation": "i", "self_ready": False, "peers": peers}, 8192) is None
    assert "is not a rank in 0..8190" in check_links(
        {"incarnation": "i", "self_ready": False, "peers": peers}, 8191
    )
