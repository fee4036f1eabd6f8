"""Subgroups (``dist.new_group`` on a foldplane group): a static backend over the ranks named,
rendezvoused on the coordinator's store under the installed view's version."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.distributed import PrefixStore

from foldplane.agent.dataplane import DataPlaneError, keys


def test_a_subgroup_of_two_of_three_ranks_runs_collectives_between_them(make_plane) -> None:
    planes = [make_plane(rank=r, world_size=3) for r in range(3)]
    for dp in planes:
        dp.install_view(4, [0, 1, 2])
    members = [planes[0], planes[2]]  # global ranks 0 and 2 are subgroup ranks 0 and 1
    with ThreadPoolExecutor(2) as pool:
        backends = list(pool.map(lambda i: members[i].build_subgroup("g7", i, 2, 10.0), range(2)))
    tensors = [torch.full((2,), float(r + 1)) for r in range(2)]
    works = [be.allreduce([t]) for be, t in zip(backends, tensors, strict=True)]
    for w in works:
        w.wait()
    assert [t.tolist() for t in tensors] == [[3.0, 3.0], [3.0, 3.0]]
    # The rank outside it never took part, and the full group still works on its own.
    outs = [torch.full((1,), float(r)) for r in range(3)]
    works = [
        dp.process_group().all_reduce(t, async_op=True) for dp, t in zip(planes, outs, strict=True)
    ]
    assert all(w.wait() for w in works) and [t.item() for t in outs] == [3.0, 3.0, 3.0]


def test_the_rendezvous_keys_carry_the_view_version_so_stale_keys_are_never_met(
    make_plane, store
) -> None:
    a, b = make_plane(rank=0), make_plane(rank=1)
    for dp in (a, b):
        dp.install_view(9, [0, 1])
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda p: p[0].build_subgroup("sg", p[1], 2, 10.0), [(a, 0), (b, 1)]))
    assert keys.subgroup_prefix(9, "sg") == "subgroup/9/sg/"
    # gloo's rendezvous wrote its addresses under that prefix, nowhere else.
    assert PrefixStore(keys.subgroup_prefix(9, "sg"), store).num_keys() >= 2
    assert not store.check([keys.subgroup_prefix(8, "sg") + "0"])


def test_a_member_that_never_calls_fails_the_build_naming_the_subgroup(make_plane) -> None:
    a = make_plane(rank=0)
    a.install_view(1, [0, 1])
    with pytest.raises(DataPlaneError, match=r"subgroup 'lonely' \(rank 0 of 2, view 1\)"):
        a.build_subgroup("lonely", 0, 2, 1.0)
