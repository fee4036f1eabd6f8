"""The data plane across real processes: gloo on CPU, a TCPStore on 127.0.0.1, real SIGKILLs.

One module-wide cluster of 4 worker processes; the test process plays the coordinator (it
hosts the store and commits the views). A test that kills a rank respawns it (a new
incarnation) for the next one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dataplane.cluster import Cluster

WORLD = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(WORLD)
    c.spawn(*range(WORLD))
    yield c
    c.close()


def one_hot(rank: int) -> list[int]:
    return [1 if r == rank else 0 for r in range(WORLD)]


def all_reduce_sum(ranks: list[int]) -> list[float]:
    return [float(sum(r + 1 for r in ranks))] * 4


# the last rank in the default suite; rank 0 (the view's first) and a middle rank in the slow
# one: each kill costs a respawn of a torch process
@pytest.mark.parametrize(
    "victim", [3, pytest.param(0, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_sigkilled_rank_is_named_by_every_survivor_and_the_next_view_works(
    cluster: Cluster, victim: int
) -> None:
    v = cluster.ensure_full_view()
    assert all(
        r["ok"] and r["out"] == all_reduce_sum(list(range(WORLD)))
        for r in cluster.op(list(range(WORLD)), "all_reduce").values()
    )
    cluster.call_all({r: ("evidence", ()) for r in range(WORLD)})  # drop the up evidence so far
    survivors = [r for r in range(WORLD) if r != victim]

    # The survivors enter an all_reduce the victim never joins; the victim is SIGKILLed.
    cluster.start({r: ("op", ("all_reduce", {})) for r in survivors})
    cluster.kill(victim)
    failed = cluster.collect(survivors)
    for rank, res in failed.items():
        assert res["ok"] is False, f"rank {rank}: {res}"
        assert res["hint"] == one_hot(victim), (
            f"rank {rank} blamed {res['hint']}, not rank {victim}"
        )
        assert res["hint_dtype"] == "torch.int32" and res["version"] == v

    # Every later op on the failed view fails at once with the same hint.
    again = cluster.op(survivors, "barrier")
    assert all(not r["ok"] and r["hint"] == one_hot(victim) for r in again.values())
    evidence = cluster.call_all({r: ("evidence", ()) for r in survivors})
    for rank in survivors:
        assert (v, {victim: "down"}, [victim]) in evidence[rank], evidence[rank]

    # The next committed view (without the victim) brings a new group: the op succeeds.
    v2 = cluster.commit(survivors)
    recovered = cluster.op(survivors, "all_reduce")
    for rank, res in recovered.items():
        assert res["ok"] and res["out"] == all_reduce_sum(survivors), f"rank {rank}: {res}"
        assert res["hint"] == [0] * WORLD and res["version"] == v2


def test_transient_link_failure_then_in_place_rejoin(cluster: Cluster) -> None:
    cluster.ensure_full_view()
    pids = {r: cluster.procs[r].pid for r in range(WORLD)}
    cluster.call(0, "inject", 2)  # rank 0's link to rank 2 breaks
    res = cluster.op(list(range(WORLD)), "all_reduce")
    assert all(not r["ok"] for r in res.values()), res
    assert res[0]["hint"] == one_hot(2)  # the end that saw it names its peer
    assert res[2]["hint"] == one_hot(0)  # the other end names the first
    assert res[1]["hint"] == res[3]["hint"] == one_hot(2)  # bystanders adopt rank 0's names

    # The coordinator drops rank 2; its loop keeps running, its ops complete locally.
    cluster.commit([0, 1, 3])
    res = cluster.op(list(range(WORLD)), "all_reduce")
    assert all(res[r]["ok"] and res[r]["out"] == all_reduce_sum([0, 1, 3]) for r in (0, 1, 3)), res
    assert res[2]["ok"] and res[2]["out"] == [3.0] * 4  # unchanged: rank 2's own value

    # The link is fine again: rank 2 rejoins in place (same process, same incarnation).
    cluster.commit(list(range(WORLD)))
    res = cluster.op(list(range(WORLD)), "all_reduce")
    assert all(r["ok"] and r["out"] == all_reduce_sum(list(range(WORLD))) for r in res.values()), (
        res
    )
    assert {r: cluster.procs[r].pid for r in range(WORLD)} == pids


def test_collectives_with_a_hole_in_the_active_set(cluster: Cluster) -> None:
    cluster.ensure_full_view()
    members = [0, 1, 3]
    cluster.commit(members)
    everyone = list(range(WORLD))

    gathered = cluster.op(everyone, "all_gather")
    for r in members:
        assert gathered[r]["ok"]
        assert gathered[r]["out"] == [
            [0.0, 0.0],
            [1.0, 1.0],
            [-1.0, -1.0],
            [3.0, 3.0],
        ]  # rank 2's slot untouched
    assert gathered[2]["ok"] and gathered[2]["out"] == [[-1.0, -1.0]] * WORLD

    scattered = cluster.op(everyone, "reduce_scatter")
    for r in members:  # rank m sends m*10 + j to rank j; rank r gets the sum over the members
        assert (
            scattered[r]["ok"]
            and scattered[r]["out"] == [float(sum(m * 10 + r for m in members))] * 2
        )
    assert scattered[2]["out"] == [-1.0, -1.0]

    bcast = cluster.op(members, "broadcast", src=3)
    assert all(b["ok"] and b["out"] == [3.0] * 4 for b in bcast.values())

    # src=2 is not in the view: that op fails on every member, naming rank 2; the view lives on.
    bad = cluster.op(members, "broadcast", src=2)
    assert all(not b["ok"] and b["hint"] == one_hot(2) for b in bad.values())

    cluster.start({0: ("op", ("send", {"dst": 3})), 3: ("op", ("recv", {"src": 0}))})
    p2p = cluster.collect([0, 3])
    assert p2p[0]["ok"] and p2p[3]["ok"] and p2p[3]["out"] == [100.0] * 4
    assert all(b["ok"] for b in cluster.op(members, "barrier").values())


def test_send_to_a_dead_rank_reports_failure_naming_it(cluster: Cluster) -> None:
    cluster.ensure_full_view()
    assert all(r["ok"] for r in cluster.op(list(range(WORLD)), "barrier").values())
    cluster.kill(1)
    res = cluster.call(0, "op", "send", {"dst": 1})
    assert res["ok"] is False and res["hint"] == one_hot(1)
    # The view is poisoned for everyone: the others fail fast, naming the dead rank as well.
    others = cluster.op([2, 3], "all_reduce")
    assert all(not r["ok"] and r["hint"] == one_hot(1) for r in others.values())


def test_a_rank_dead_before_the_view_is_built_is_named_by_the_members(cluster: Cluster) -> None:
    cluster.ensure_full_view()
    cluster.kill(1)
    cluster.commit(list(range(WORLD)))  # committed before anyone noticed the death
    res = cluster.op([0, 2, 3], "all_reduce")
    assert all(not r["ok"] and r["hint"] == one_hot(1) for r in res.values()), res
