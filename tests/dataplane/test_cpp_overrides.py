"""The operations torch 2.14's C++ hands to a Python process group, reached through C++.

Each call goes through the method torch binds on its C++ ``ProcessGroup`` (``dist.ProcessGroup
.reduce(pg, ...)`` runs the C++ virtual), which since torch 2.14 calls the group's Python
override of ``reduce``, ``gather``, ``scatter``, ``alltoall``, ``recvAnysource``,
``start_coalescing``/``end_coalescing``, ``all_gather_single``, ``reduce_scatter_single`` (and,
as 2.13 already did, the coalesced and all-to-all ones). A None from an override would come
back as a null ``Work``: each answer here is a real one, its tensors are right, global ranks
hold, and the slots of a rank outside the view are neither sent nor written (view ``[0, 2]`` of
3). torch 2.13's C++ sent the same calls to a C++ backend the foldplane group does not have.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllToAllOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from foldplane.agent.dataplane.work import CoalescedWork

pytestmark = pytest.mark.skipif(
    tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 14),
    reason="torch 2.13's C++ does not call these overrides of a Python process group",
)

SENTINEL = -7.0
PG = dist.ProcessGroup
CPU = torch.device("cpu")


def _views(make_plane, members=(0, 2), world_size=3):
    planes = [make_plane(rank=r, world_size=world_size) for r in range(world_size)]
    for dp in planes:
        dp.install_view(1, list(members))
    return [dp.process_group() for dp in planes]


def _together(calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def _done(works) -> None:
    """Each answer is a real ``Work`` (not the null one a None becomes) that succeeded."""
    assert all(isinstance(w, dist.Work) for w in works), works
    assert all(w.wait() for w in works)


def test_reduce_gather_and_scatter_reach_the_group_from_cpp(make_plane) -> None:
    pgs = _views(make_plane)
    r_opts = ReduceOptions()
    r_opts.rootRank, r_opts.reduceOp = 2, dist.ReduceOp.MAX
    ts = {r: torch.full((2,), float(r + 1)) for r in (0, 2)}
    _done(_together([lambda r=r: PG.reduce(pgs[r], [ts[r]], r_opts) for r in (0, 2)]))
    assert ts[2].tolist() == [3.0, 3.0]  # max of ranks 0 and 2, into global rank 2

    g_opts = GatherOptions()
    g_opts.rootRank = 0
    slots = [torch.full((1,), SENTINEL) for _ in range(3)]
    calls = [
        lambda: PG.gather(pgs[0], [slots], [torch.full((1,), 10.0)], g_opts),
        lambda: PG.gather(pgs[2], [], [torch.full((1,), 12.0)], g_opts),
    ]
    _done(_together(calls))
    assert [s.item() for s in slots] == [10.0, SENTINEL, 12.0]

    s_opts = ScatterOptions()
    s_opts.rootRank = 2
    out = {0: torch.zeros(1), 2: torch.zeros(1)}
    sources = [torch.full((1,), 20.0 + r) for r in range(3)]
    calls = [
        lambda: PG.scatter(pgs[2], [out[2]], [sources], s_opts),
        lambda: PG.scatter(pgs[0], [out[0]], [], s_opts),
    ]
    _done(_together(calls))
    assert (out[0].item(), out[2].item()) == (20.0, 22.0)


def test_all_gather_single_and_reduce_scatter_single_reach_the_group_from_cpp(make_plane) -> None:
    pgs = _views(make_plane)
    gathered = {r: torch.full((6,), SENTINEL) for r in (0, 2)}
    calls = [
        lambda r=r: PG.all_gather_single(
            pgs[r], gathered[r], torch.full((2,), float(r)), AllgatherOptions()
        )
        for r in (0, 2)
    ]
    _done(_together(calls))
    for r in (0, 2):
        assert gathered[r].tolist() == [0.0, 0.0, SENTINEL, SENTINEL, 2.0, 2.0]

    reduced = {r: torch.full((2,), SENTINEL) for r in (0, 2)}
    inputs = {r: torch.arange(6.0) + 10 * r for r in (0, 2)}  # slot q holds [2q, 2q+1] + 10r
    calls = [
        lambda r=r: PG.reduce_scatter_single(pgs[r], reduced[r], inputs[r], ReduceScatterOptions())
        for r in (0, 2)
    ]
    _done(_together(calls))
    assert reduced[0].tolist() == [20.0, 22.0]  # slot 0 of rank 0 + slot 0 of rank 2
    assert reduced[2].tolist() == [28.0, 30.0]


def test_alltoall_sends_each_member_its_entry_and_leaves_the_others(make_plane) -> None:
    pgs = _views(make_plane)
    # entry q of rank r: q + 1 values r*10 + q; what rank r receives from q has r + 1 values
    ins = {r: [torch.full((q + 1,), 10.0 * r + q) for q in range(3)] for r in (0, 2)}
    outs = {r: [torch.full((r + 1,), SENTINEL) for _ in range(3)] for r in (0, 2)}
    calls = [lambda r=r: PG.alltoall(pgs[r], outs[r], ins[r], AllToAllOptions()) for r in (0, 2)]
    _done(_together(calls))
    assert [t.tolist() for t in outs[0]] == [[0.0], [SENTINEL], [20.0]]
    assert [t.tolist() for t in outs[2]] == [[2.0] * 3, [SENTINEL] * 3, [22.0] * 3]


def test_all_to_all_single_with_split_sizes_keeps_global_ranks(make_plane) -> None:
    pgs = _views(make_plane)
    # rank r sends q + 1 rows to rank q; rank r receives r + 1 rows from each rank
    ins = {r: torch.arange(6.0) + 100 * r for r in (0, 2)}  # rank r's chunk for q: q+1 rows
    outs = {r: torch.full((3 * (r + 1),), SENTINEL) for r in (0, 2)}
    calls = [
        lambda r=r: PG.all_to_all_single(
            pgs[r], outs[r], ins[r], [r + 1] * 3, [1, 2, 3], AllToAllOptions()
        )
        for r in (0, 2)
    ]
    _done(_together(calls))
    assert outs[0].tolist() == [0.0, SENTINEL, 200.0]
    assert outs[2].tolist() == [3.0, 4.0, 5.0, SENTINEL, SENTINEL, SENTINEL, 203.0, 204.0, 205.0]


def test_all_to_all_single_over_the_whole_world_hands_gloo_the_tensors(make_plane) -> None:
    full = _views(make_plane, members=(0, 1), world_size=2)
    got = {r: torch.zeros(2) for r in range(2)}
    calls = [
        lambda r=r: PG.all_to_all_single(
            full[r], got[r], torch.tensor([1.0, 2.0]) + 10 * r, [], [], AllToAllOptions()
        )
        for r in range(2)
    ]
    _done(_together(calls))
    assert got[0].tolist() == [1.0, 11.0] and got[1].tolist() == [2.0, 12.0]


def test_recv_from_any_source_reaches_the_group_from_cpp(make_plane) -> None:
    pgs = _views(make_plane)
    got = torch.zeros(2)
    calls = [
        lambda: PG.recv_anysource(pgs[0], [got], 0),
        lambda: pgs[2].send(torch.full((2,), 2.0), 0, async_op=True),
    ]
    recv, send = _together(calls)
    _done([recv, send])
    assert got.tolist() == [2.0, 2.0]
    # torch's C++ wrapper of a Python work forwards wait() and get_future() only: the sender's
    # rank is known to Python callers (dist.recv returns it: test_rooted.py), not through C++
    with pytest.raises(RuntimeError, match="sourceRank"):
        recv._source_rank()


def test_a_coalescing_region_answers_for_every_operation_issued_in_it(make_plane) -> None:
    pgs = _views(make_plane)

    def region(r: int) -> dist.Work:
        pgs[r]._start_coalescing(CPU)  # the C++ binding: startCoalescing, then ours
        pgs[r].all_reduce(torch.ones(2))
        pgs[r].broadcast(torch.full((1,), float(r)), 2)
        return pgs[r]._end_coalescing(CPU)

    works = _together([lambda r=r: region(r) for r in (0, 2)])
    _done(works)
    # C++ holds our work: its future completes with the all_reduce's and the broadcast's tensors
    assert [t.tolist() for t in works[1].get_future().wait()] == [[2.0, 2.0], [2.0]]

    # an operation that fails in the region fails the region's work, naming the rank
    def failing(r: int) -> dist.Work:
        pgs[r]._start_coalescing(CPU)
        pgs[r].all_reduce(torch.ones(1))
        pgs[r].reduce(torch.ones(1), 1)  # rank 1 is outside the view
        return pgs[r].end_coalescing(CPU)

    works = _together([lambda r=r: failing(r) for r in (0, 2)])
    assert all(isinstance(w, CoalescedWork) for w in works)
    assert [w.wait() for w in works] == [False, False]
    assert works[0].failed_ranks_hint().tolist() == [0, 1, 0]
    # an empty region succeeds; a region left open is replaced by the next one
    pgs[0]._start_coalescing(CPU)
    pgs[0]._start_coalescing(CPU)
    assert pgs[0]._end_coalescing(CPU).wait()
    with pytest.raises(RuntimeError, match="end_coalescing on rank 0 without start_coalescing"):
        pgs[0]._end_coalescing(CPU)


def test_the_coalesced_single_tensor_operations_reach_the_group_from_cpp(make_plane) -> None:
    pgs = _views(make_plane)
    outs = {r: [torch.full((6,), SENTINEL), torch.full((3,), SENTINEL)] for r in (0, 2)}
    ins = {r: [torch.full((2,), float(r)), torch.full((1,), -1.0 - r)] for r in (0, 2)}
    calls = [
        lambda r=r: PG.all_gather_single_coalesced(pgs[r], outs[r], ins[r], AllgatherOptions())
        for r in (0, 2)
    ]
    _done(_together(calls))
    for r in (0, 2):
        assert outs[r][0].tolist() == [0.0, 0.0, SENTINEL, SENTINEL, 2.0, 2.0]
        assert outs[r][1].tolist() == [-1.0, SENTINEL, -3.0]

    reduced = {r: [torch.full((1,), SENTINEL), torch.full((2,), SENTINEL)] for r in (0, 2)}
    inputs = {r: [torch.arange(3.0) + r, torch.arange(6.0) * (r + 1)] for r in (0, 2)}
    calls = [
        lambda r=r: PG.reduce_scatter_single_coalesced(
            pgs[r], reduced[r], inputs[r], ReduceScatterOptions()
        )
        for r in (0, 2)
    ]
    _done(_together(calls))
    assert [t.tolist() for t in reduced[0]] == [[2.0], [0.0, 4.0]]
    assert [t.tolist() for t in reduced[2]] == [[6.0], [16.0, 20.0]]


def test_misuse_through_cpp_raises_and_names_what_is_wrong(make_plane) -> None:
    pgs = _views(make_plane)
    with pytest.raises(ValueError, match="output_tensors must have world_size=3 entries"):
        PG.alltoall(pgs[0], [torch.ones(1)], [torch.ones(1)] * 3, AllToAllOptions())
    with pytest.raises(ValueError, match=r"input split sizes \[1, 1\] must be world_size=3"):
        PG.all_to_all_single(pgs[0], torch.ones(3), torch.ones(2), [], [1, 1], AllToAllOptions())
    with pytest.raises(ValueError, match="first dimension \\(4\\) is not divisible"):
        PG.all_to_all_single(pgs[0], torch.ones(3), torch.ones(4), [], [], AllToAllOptions())
    with pytest.raises(ValueError, match="alltoall: every tensor must have one dtype"):
        PG.alltoall(
            pgs[0], [torch.ones(1)] * 3, [torch.ones(1, dtype=torch.int64)] * 3, AllToAllOptions()
        )
