"""The hint pool: preallocated, reused, and never shared by two live operations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.agent.dataplane.hint import HintPool, fill


def test_buffers_are_preallocated_and_reused_without_allocation() -> None:
    pool = HintPool(4, torch.device("cpu"), capacity=2)
    seen = set()
    for _ in range(10):
        buf = pool.acquire()
        seen.add(buf.data_ptr())
        pool.release(buf)
    assert len(seen) == 2  # FIFO over the two preallocated buffers, nothing new
    assert pool.allocated == 2


def test_outstanding_leases_never_share_a_buffer() -> None:
    pool = HintPool(3, torch.device("cpu"), capacity=2)
    a, b = pool.acquire(), pool.acquire()
    fill(a, [2])
    c = pool.acquire()  # the pool is empty: it grows rather than hand out a live buffer
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3
    assert pool.allocated == 3
    assert a.tolist() == [0, 0, 1]  # untouched by the later leases


def test_acquired_buffers_are_zeroed_int32_of_world_size() -> None:
    pool = HintPool(5, torch.device("cpu"), capacity=1)
    buf = pool.acquire()
    fill(buf, [0, 4])
    pool.release(buf)
    again = pool.acquire()
    assert again.data_ptr() == buf.data_ptr()
    assert again.dtype == torch.int32 and again.shape == (5,)
    assert again.tolist() == [0, 0, 0, 0, 0]


def test_fill_marks_exactly_the_failed_ranks() -> None:
    buf = torch.ones(4, dtype=torch.int32)
    fill(buf, [1, 3])
    assert buf.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("world_size, capacity", [(0, 1), (2, 0)])
def test_bad_sizes_are_refused(world_size: int, capacity: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        HintPool(world_size, torch.device("cpu"), capacity=capacity)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 15)), max_size=60))
def test_live_leases_never_share_a_buffer_and_the_pool_grows_only_to_the_peak(steps) -> None:
    """Any interleaving of acquires and releases: live buffers are distinct and keep their contents."""
    pool = HintPool(4, torch.device("cpu"), capacity=3)
    live: list[tuple[torch.Tensor, list[int]]] = []
    peak = 0
    for acquire, pick in steps:
        if acquire or not live:
            buf = pool.acquire()
            assert buf.tolist() == [0, 0, 0, 0]
            ranks = [pick % 4]
            fill(buf, ranks)
            live.append((buf, ranks))
        else:
            buf, _ = live.pop(pick % len(live))
            pool.release(buf)
        peak = max(peak, len(live))
        assert len({b.data_ptr() for b, _ in live}) == len(live)
        for b, ranks in live:
            assert b.nonzero().flatten().tolist() == ranks
    assert pool.allocated == max(3, peak)
