"""``DataPlane.switch_store``: the coordinator that hosts the store restarted or failed over.

Real gloo backends and real TCPStores in this process: two data planes of one group move from
one store to another between views.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore

from foldplane.agent.dataplane import DataPlaneError, keys


def _host_store() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


def test_both_ranks_move_to_a_new_store_and_build_the_next_view_there(make_plane, store) -> None:
    a, b = make_plane(rank=0, world_size=2), make_plane(rank=1, world_size=2)
    pa, pb = a.process_group(), b.process_group()
    for dp in (a, b):
        dp.install_view(1, [0, 1])
    ta, tb = torch.ones(2), torch.full((2,), 2.0)
    w1, w2 = pa.all_reduce(ta, async_op=True), pb.all_reduce(tb, async_op=True)
    assert w1.wait() and w2.wait()

    moved = _host_store()
    for dp in (a, b):
        dp.switch_store("127.0.0.1", moved.port)
        assert dp.store_address == ("127.0.0.1", moved.port)
        assert dp.ready
    # The installed view keeps its backend: its links never went through the store.
    w1, w2 = (
        pa.all_reduce(torch.ones(2), async_op=True),
        pb.all_reduce(torch.ones(2), async_op=True),
    )
    assert w1.wait() and w2.wait()
    # Both registered on the new store, with their liveness counters and the installed view.
    for dp in (a, b):
        assert moved.get(keys.incarnation(dp.rank)).decode() == dp.incarnation
        assert int(moved.add(keys.heartbeat(dp.rank, dp.incarnation), 0)) >= 1
        assert moved.get(keys.member(1, dp.rank)).decode() == dp.incarnation

    for dp in (a, b):
        dp.install_view(2, [0, 1])
    ta, tb = torch.ones(2), torch.full((2,), 2.0)
    w1, w2 = pa.all_reduce(ta, async_op=True), pb.all_reduce(tb, async_op=True)
    assert w1.wait() and w2.wait()
    assert ta.tolist() == tb.tolist() == [3.0, 3.0]
    assert pa.version == pb.version == 2  # the same process group objects follow view 2
    assert moved.check([keys.member(2, 0), keys.member(2, 1)])
    assert not store.check([keys.member(2, 0)]), "view 2 was registered on the old store"

    # The poison watch runs on the new store: rank 1 fails fast when rank 0 breaks the link.
    a.inject_link_failure(1)
    failed = pb.barrier(async_op=True)
    assert failed.wait() is False
    assert pb.get_failed_ranks_hint(failed).tolist() == [1, 0]
    assert moved.check([keys.fail(2, 1)])


def test_the_same_address_is_a_no_op(make_plane, store) -> None:
    dp = make_plane(rank=0, world_size=1)
    control = dp.control_store()
    dp.switch_store("127.0.0.1", store.port)
    assert dp.control_store() is control


def test_an_unreachable_store_is_refused_by_name_and_the_old_one_is_kept(make_plane, store) -> None:
    # the timeout bounds the wait on the dead port below; it also bounds each connect to the
    # live store at the start: a TCPStore client of a store hosted in this process sometimes
    # takes 5.0 s to connect, even on a quiet machine (docs/dataplane.md), and 3 s failed so
    dp = make_plane(rank=0, world_size=1, store_timeout_s=10.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # bound, never listening: nobody answers there
        with pytest.raises(DataPlaneError, match=f"127.0.0.1:{dead_port}"):
            dp.switch_store("127.0.0.1", dead_port)
    assert dp.store_address == ("127.0.0.1", store.port)
    assert dp.ready
    dp.install_view(1, [0])
    assert dp.process_group().all_reduce(torch.ones(2)).wait() is True


def test_a_closed_data_plane_refuses_to_switch(make_plane) -> None:
    dp = make_plane(rank=0, world_size=1)
    dp.close()
    moved = _host_store()
    with pytest.raises(DataPlaneError, match="closed"):
        dp.switch_store("127.0.0.1", moved.port)
