"""The hint pool: preallocated, reused, and never shared by two live operations."""

from __future__ import annotations

import pytest
import torch

from agent.dataplane.hint import HintPool, fill


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
