"""Views that reconfigure one gloo backend (``gloo_reconfigure``, torch >= 2.14) inside one
process: two data planes of one group, a real TCPStore, real gloo; the cases across processes
with real SIGKILLs are in ``test_gloo_reconfigure_processes.py``."""

from __future__ import annotations

import pytest
import torch

from foldplane.agent.dataplane import DataPlaneError
from foldplane.agent.dataplane.persistent import POOL, SUPPORTED, view_uuid

pytestmark = pytest.mark.skipif(
    not SUPPORTED, reason=f"gloo is reconfigurable from torch 2.14 (this is {torch.__version__})"
)


def _both(planes, version: int, members: list[int]) -> None:
    for dp in planes:  # every rank follows every view, as its agent installs them
        dp.install_view(version, members)


#: the data plane's own default (the fixture's 5 s is for tests that wait out a deadline): a
#: first reconfigure connects the backend's pairs through the store, and the shared machine
#: sometimes stalls a store connect for seconds (a 5 s deadline failed view 1 once in a full
#: default-suite run); these tests check what the views do, not how fast
TIMEOUT_S = 30.0


def test_every_view_reconfigures_the_same_gloo_backend(make_plane) -> None:
    a = make_plane(rank=0, world_size=2, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
    b = make_plane(rank=1, world_size=2, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
    pa, pb = a.process_group(), b.process_group()
    for version in (1, 2, 3):
        _both((a, b), version, [0, 1])
        ta, tb = torch.full((3,), 1.0), torch.full((3,), 2.0)
        wa, wb = pa.all_reduce(ta, async_op=True), pb.all_reduce(tb, async_op=True)
        assert wa.wait() and wb.wait()
        assert ta.tolist() == tb.tolist() == [3.0] * 3
    for dp in (a, b):
        gloo = dp.persistent_gloo
        assert gloo is not None and (gloo.built, gloo.reconfigured) == (1, 3)
    assert a.persistent_gloo._lent == [a.current_view()._backend]  # lent to the installed view


def test_the_pool_s_store_clients_connect_when_the_session_opens_not_in_a_view_s_build(
    make_plane,
) -> None:
    """A store connect may take seconds (torch reverse-resolves the store's address on each
    one): the ``POOL`` backends' clients are made with the session, so the builds of the views
    that reconfigure them connect nothing and their deadlines never pay for it."""
    planes = [
        make_plane(rank=r, world_size=2, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
        for r in (0, 1)
    ]
    late: list[int] = []
    for dp in planes:
        assert dp.persistent_gloo is not None and len(dp.persistent_gloo._clients) == POOL
        connect = dp.connect_store

        def recorded(host, port, dp=dp, connect=connect):
            late.append(dp.rank)
            return connect(host, port)

        dp.connect_store = recorded  # what the pool calls for a backend it has no client for
    pgs = [dp.process_group() for dp in planes]
    for version in (1, 2):
        _both(planes, version, [0, 1])
        works = [pg.all_reduce(torch.ones(2), async_op=True) for pg in pgs]
        assert all(w.wait() for w in works)
    assert late == []
    assert [dp.persistent_gloo.built for dp in planes] == [1, 1]
    assert [len(dp.persistent_gloo._clients) for dp in planes] == [POOL - 1] * 2


def test_a_view_after_a_failure_takes_the_second_backend_and_the_pool_stays_at_two(
    make_plane,
) -> None:
    a = make_plane(rank=0, world_size=2, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
    b = make_plane(rank=1, world_size=2, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
    pa, pb = a.process_group(), b.process_group()
    _both((a, b), 1, [0, 1])
    first = pa.barrier(async_op=True)
    assert pb.barrier().wait() and first.wait()
    for version in (2, 4):
        # rank 0 alone enters an all_reduce; its link to rank 1 breaks: the op is still in gloo
        stuck = pa.all_reduce(torch.ones(2), async_op=True)
        a.inject_link_failure(1)
        assert stuck.wait() is False
        for v in (version, version + 1):  # the failed view's op is ended; both views run
            _both((a, b), v, [0, 1])
            ta, tb = torch.full((2,), 1.0), torch.full((2,), 5.0)
            wa, wb = pa.all_reduce(ta, async_op=True), pb.all_reduce(tb, async_op=True)
            assert wa.wait() and wb.wait() and ta.tolist() == [6.0, 6.0]
    # the view after the first failure made the second backend; nothing else was built
    assert (a.persistent_gloo.built, a.persistent_gloo.reconfigured) == (2, 5)
    assert (b.persistent_gloo.built, b.persistent_gloo.reconfigured) == (1, 5)


def test_a_view_of_fewer_ranks_renumbers_them_in_the_same_backend(make_plane) -> None:
    # (a long timeout: see TIMEOUT_S)
    planes = [
        make_plane(rank=r, world_size=3, gloo_reconfigure=True, collective_timeout_s=TIMEOUT_S)
        for r in range(3)
    ]
    _both(planes, 1, [0, 1, 2])
    _both(planes, 2, [0, 2])  # rank 2 is in-view rank 1 now
    t0, t2 = torch.full((1,), 1.0), torch.full((1,), 2.0)
    w0 = planes[0].process_group().broadcast(t0, src=2, async_op=True)
    w2 = planes[2].process_group().broadcast(t2, src=2, async_op=True)
    assert w0.wait() and w2.wait() and t0.tolist() == [2.0]
    assert planes[2].persistent_gloo._lent[-1].rank() == 1
    assert planes[2].persistent_gloo._lent[-1].size() == 2


def test_the_uuid_of_a_view_is_its_version_and_attempt() -> None:
    assert view_uuid(1) == 256 and view_uuid(7, 3) == 7 * 256 + 3
    with pytest.raises(ValueError, match="attempt must be in 0..255, got 256"):
        view_uuid(1, 256)


def test_the_setting_is_off_by_default_on_by_the_environment_and_refused_on_an_older_torch(
    make_plane, monkeypatch
) -> None:
    monkeypatch.delenv("FOLDPLANE_GLOO_RECONFIGURE", raising=False)
    assert make_plane(rank=0, world_size=1).persistent_gloo is None
    assert make_plane(rank=0, world_size=1, gloo_reconfigure=True).persistent_gloo is not None
    monkeypatch.setenv("FOLDPLANE_GLOO_RECONFIGURE", "1")
    assert make_plane(rank=0, world_size=1).persistent_gloo is not None
    assert make_plane(rank=0, world_size=1, gloo_reconfigure=False).persistent_gloo is None
    monkeypatch.setattr("foldplane.agent.dataplane.plane.GLOO_RECONFIGURE_SUPPORTED", False)
    assert make_plane(rank=0, world_size=1).persistent_gloo is None  # torch < 2.14: fresh
    with pytest.raises(ValueError, match=r"needs torch's reconfigure API \(torch >= 2.14\)"):
        make_plane(rank=0, world_size=1, gloo_reconfigure=True)


def test_a_closed_plane_releases_its_backend(make_plane) -> None:
    dp = make_plane(rank=0, world_size=1, gloo_reconfigure=True)
    dp.install_view(1, [0])
    assert dp.process_group().barrier().wait()
    gloo = dp.persistent_gloo
    dp.close()
    assert gloo._idle == [] and gloo._lent == []
    with pytest.raises(DataPlaneError):
        dp.process_group().barrier()


# -- a view that torch's reconfigure committed: one backend, taken by torch's model ------------


def test_a_reconfigure_view_numbers_its_members_in_handle_order_and_hands_its_backend_over(
    make_plane,
) -> None:
    import time

    planes = [make_plane(rank=r, world_size=3) for r in range(3)]
    for dp in planes:
        dp.serve_configurations()
        dp.install_view(1, [0, 1, 2], order=[2, 0, 1])  # rank 2 is in-view rank 0
    deadline = time.monotonic() + 10
    taken = {dp.rank: dp.claim_view(1, [2, 0, 1], deadline) for dp in planes}
    assert {dp.rank: taken[dp.rank]["cpu"].rank() for dp in planes} == {2: 0, 0: 1, 1: 2}
    # the view's own backend is the one taken (no second backend was built for it)
    assert all(dp.current_view()._backend is None for dp in planes)
    ts = {r: torch.full((1,), float(r)) for r in range(3)}
    works = [taken[r]["cpu"].broadcast([ts[r]]) for r in range(3)]  # root: position 0 = rank 2
    for w in works:
        w.wait()
    assert [t.item() for t in ts.values()] == [2.0, 2.0, 2.0]
    with pytest.raises(DataPlaneError, match="belongs to the group of torch's reconfigure model"):
        planes[0].process_group().barrier()


def test_a_reconfigure_view_retired_before_it_is_claimed_keeps_its_backend_for_the_claim(
    make_plane,
) -> None:
    import time

    planes = [make_plane(rank=r, world_size=2) for r in range(2)]
    for dp in planes:
        dp.serve_configurations()
        dp.install_view(1, [0, 1], order=[1, 0])
    for dp in planes:  # the build notifies the view's condition when it is done
        view = dp.current_view()
        with view._cond:
            built = view._cond.wait_for(lambda v=view: v._built or v.failure is not None, 10)
        assert built and view.failure is None, (dp.rank, view.failure)
    for dp in planes:
        dp.install_view(2, [0, 1])
    taken = [dp.claim_view(1, [1, 0], time.monotonic() + 5)["cpu"] for dp in planes]
    assert [b.rank() for b in taken] == [1, 0]
    with pytest.raises(DataPlaneError, match=r"view 1 has no backend over \[1, 0\]"):
        planes[0].claim_view(1, [1, 0], time.monotonic() + 1)  # taken already


def test_install_view_refuses_an_order_that_is_not_its_members(make_plane) -> None:
    dp = make_plane(rank=0, world_size=3)
    with pytest.raises(ValueError, match=r"order \[0, 2\] is not the active ranks \[0, 1\]"):
        dp.install_view(1, [0, 1], order=[0, 2])


@pytest.mark.parametrize("reconfigure", [False, True], ids=["fresh", "reconfigured"])
def test_a_reconfigure_view_retired_while_it_builds_keeps_its_backend_for_the_claim(
    make_plane, reconfigure
) -> None:
    """The merge of {0} with {1, 2} in torch's model: a half's view is committed, then the other
    half's, before a member's build of the first is done (a reconfigured backend's build is the
    slower one: handles first). The late build's backend is kept for the member's claim, as a
    view retired once built keeps it; a claim made while it builds waits for it."""
    import threading
    import time

    a, b = (
        make_plane(rank=r, world_size=2, gloo_reconfigure=reconfigure, collective_timeout_s=30.0)
        for r in range(2)
    )
    for dp in (a, b):
        dp.serve_configurations()
    a.install_view(1, [0, 1], order=[1, 0])  # a's build waits for b's at the rendezvous
    a.install_view(2, [0])  # a newer view retires view 1 on a while it builds
    taken: dict[int, object] = {}
    claim = threading.Thread(
        target=lambda: taken.setdefault(0, a.claim_view(1, [1, 0], time.monotonic() + 20)["cpu"])
    )
    claim.start()  # waits for the build of the retired view
    b.install_view(1, [0, 1], order=[1, 0])
    taken[1] = b.claim_view(1, [1, 0], time.monotonic() + 20)["cpu"]
    claim.join(timeout=25)
    assert not claim.is_alive() and sorted(taken) == [0, 1]
    assert [taken[r].rank() for r in (0, 1)] == [1, 0]
    ts = {0: torch.zeros(2), 1: torch.full((2,), 7.0)}
    works = [taken[r].broadcast([ts[r]]) for r in (0, 1)]  # root: position 0 = rank 1
    for w in works:
        w.wait()
    assert ts[0].tolist() == [7.0, 7.0]
    if reconfigure:  # torch's model took it: the pool lends it to no later view
        pool = a.persistent_gloo
        assert not any(x is taken[0] for x in (*pool._lent, *pool._idle))
