"""``reduce``, ``gather`` and ``scatter`` over a view: global ranks, world-size lists, and the
entries of ranks outside the view neither sent nor written."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GatherOptions, ReduceOptions

SENTINEL = -7.0


def _views(make_plane, members=(0, 2), world_size=3):
    planes = [make_plane(rank=r, world_size=world_size) for r in range(world_size)]
    for dp in planes:
        dp.install_view(1, list(members))
    return [dp.process_group() for dp in planes]


def _together(calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_reduce_sums_the_members_into_dst_given_as_a_global_rank(make_plane) -> None:
    pgs = _views(make_plane)
    ts = [torch.full((2,), float(r + 1)) for r in range(3)]
    works = _together([lambda r=r: pgs[r].reduce(ts[r], 2, dist.ReduceOp.MAX) for r in (0, 2)])
    assert all(w.wait() for w in works)
    assert ts[2].tolist() == [3.0, 3.0]  # max over ranks 0 and 2 (values 1 and 3)
    assert ts[1].tolist() == [2.0, 2.0]  # outside the view: untouched, never called


def test_gather_fills_the_members_slots_and_leaves_the_others_unchanged(make_plane) -> None:
    pgs = _views(make_plane)
    slots = [torch.full((2,), SENTINEL) for _ in range(3)]
    calls = [
        lambda: pgs[0].gather(torch.full((2,), 10.0), slots, 0),
        lambda: pgs[2].gather(torch.full((2,), 12.0), None, 0),
    ]
    assert all(w.wait() for w in _together(calls))
    assert [s.tolist() for s in slots] == [[10.0, 10.0], [SENTINEL] * 2, [12.0, 12.0]]


def test_scatter_sends_each_member_its_slot(make_plane) -> None:
    pgs = _views(make_plane)
    out0, out2 = torch.zeros(1), torch.zeros(1)
    slots = [torch.full((1,), float(10 + r)) for r in range(3)]
    calls = [lambda: pgs[2].scatter(out2, slots, 2), lambda: pgs[0].scatter(out0, None, 2)]
    assert all(w.wait() for w in _together(calls))
    assert (out0.item(), out2.item()) == (10.0, 12.0)


def test_the_c10d_entry_points_take_torch_s_lists_and_options(make_plane) -> None:
    pgs = _views(make_plane, members=(0, 1), world_size=2)
    r_opts = ReduceOptions()
    r_opts.rootRank = 1
    ts = [torch.ones(1), torch.ones(1)]
    assert all(
        w.wait() for w in _together([lambda r=r: pgs[r].reduce([ts[r]], r_opts) for r in (0, 1)])
    )
    assert ts[1].item() == 2.0
    g_opts = GatherOptions()
    g_opts.rootRank = 0
    slots = [torch.zeros(1), torch.zeros(1)]
    calls = [
        lambda: pgs[0].gather([slots], [torch.full((1,), 5.0)], g_opts),
        lambda: pgs[1].gather([], [torch.full((1,), 6.0)], g_opts),
    ]
    assert all(w.wait() for w in _together(calls))
    assert [s.item() for s in slots] == [5.0, 6.0]


def test_a_root_outside_the_view_fails_that_op_only_and_names_it(make_plane) -> None:
    pgs = _views(make_plane)
    work = pgs[0].reduce(torch.ones(1), 1)
    assert work.wait() is False
    assert pgs[0].get_failed_ranks_hint(work).tolist() == [0, 1, 0]


def test_misuse_raises_and_names_what_is_wrong(make_plane) -> None:
    pgs = _views(make_plane)
    with pytest.raises(ValueError, match="gather_list must have world_size=3 entries"):
        pgs[0].gather(torch.ones(1), [torch.ones(1)], 0)
    with pytest.raises(ValueError, match="scatter_list must be empty on rank 2"):
        pgs[2].scatter(torch.ones(1), [torch.ones(1)] * 3, 0)
    with pytest.raises(ValueError, match="dst=5 is out of range"):
        pgs[0].reduce(torch.ones(1), 5)


def test_recv_from_any_source_names_the_sender_as_a_global_rank(make_plane) -> None:
    pgs = _views(make_plane)  # view [0, 2] of 3
    got = torch.zeros(2)
    calls = [
        lambda: pgs[0].recv_anysource([got]),
        lambda: pgs[2].send(torch.full((2,), 2.0), 0, async_op=True),
    ]
    recv, send = _together(calls)
    assert recv.wait() and send.wait()
    assert got.tolist() == [2.0, 2.0] and recv._source_rank() == 2
    with pytest.raises(ValueError, match="only known for a recv from any source"):
        send.source_rank()
