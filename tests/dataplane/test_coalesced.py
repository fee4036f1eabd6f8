"""Several tensors in one operation (``allreduce_coalesced``, ``allgather_coalesced``), and
sparse tensors in ``all_reduce``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch._C._distributed_c10d import AllreduceCoalescedOptions

SENTINEL = -7.0


def _pgs(make_plane, members=(0, 1), world_size=2):
    planes = [make_plane(rank=r, world_size=world_size) for r in range(world_size)]
    for dp in planes:
        dp.install_view(1, list(members))
    return [dp.process_group() for dp in planes]


def _together(calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_allreduce_coalesced_reduces_every_tensor_of_the_list(make_plane) -> None:
    pgs = _pgs(make_plane)
    lists = [[torch.full((2,), r + 1.0), torch.full((3,), 10.0 * (r + 1))] for r in range(2)]
    works = _together([lambda r=r: pgs[r].allreduce_coalesced(lists[r]) for r in range(2)])
    assert all(w.wait() for w in works)
    for tensors in lists:
        assert [t.tolist() for t in tensors] == [[3.0, 3.0], [30.0, 30.0, 30.0]]


def test_allgather_coalesced_writes_the_members_rows_only(make_plane) -> None:
    pgs = _pgs(make_plane, members=(0, 2), world_size=3)
    outs = {r: [[torch.full((2,), SENTINEL), torch.full((1,), SENTINEL)] for _ in range(3)]
            for r in (0, 2)}  # fmt: skip
    calls = [
        lambda r=r: pgs[r].allgather_coalesced(
            outs[r], [torch.full((2,), float(r)), torch.full((1,), -float(r))]
        )
        for r in (0, 2)
    ]
    assert all(w.wait() for w in _together(calls))
    for r in (0, 2):
        rows = [[t.tolist() for t in row] for row in outs[r]]
        assert rows == [[[0.0, 0.0], [0.0]], [[SENTINEL] * 2, [SENTINEL]], [[2.0, 2.0], [-2.0]]]


def test_coalesced_misuse_raises_and_names_what_is_wrong(make_plane) -> None:
    pgs = _pgs(make_plane)
    with pytest.raises(ValueError, match="non-empty list of tensors"):
        pgs[0].allreduce_coalesced([])
    with pytest.raises(ValueError, match=r"output_lists\[1\] must have 2 tensors"):
        pgs[0].allgather_coalesced([[torch.ones(1)] * 2, [torch.ones(1)]], [torch.ones(1)] * 2)
    opts = AllreduceCoalescedOptions()
    opts.reduceOp = torch.distributed.ReduceOp.AVG
    with pytest.raises(ValueError, match="gloo does not support"):
        pgs[0].allreduce_coalesced([torch.ones(1)], opts)


def test_all_reduce_sums_sparse_tensors_on_gloo(make_plane) -> None:
    pgs = _pgs(make_plane)
    sparse = [
        torch.sparse_coo_tensor([[r]], [float(r + 1)], (4,), check_invariants=True)
        for r in range(2)
    ]
    works = _together([lambda r=r: pgs[r].all_reduce(sparse[r], async_op=True) for r in range(2)])
    assert all(w.wait() for w in works)
    for t in sparse:
        assert t.to_dense().tolist() == [1.0, 2.0, 0.0, 0.0]
