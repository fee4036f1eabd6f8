"""Views that reconfigure one gloo backend (``gloo_reconfigure``, torch >= 2.14) across real
processes: 4 workers, a TCPStore on 127.0.0.1 hosted by the test process (which commits the
views, as the coordinator does), a real SIGKILL, then the killed rank's replacement rejoins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from foldplane.agent.dataplane.persistent import SUPPORTED
from tests.dataplane.cluster import Cluster

# slow: 4 torch processes, a kill and a respawn (about 36 s of CPU); the default suite keeps the
# in-process test_gloo_reconfigure.py, and the setting is off by default
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not SUPPORTED,
        reason=f"gloo is reconfigurable from torch 2.14 (this is {torch.__version__})",
    ),
]

WORLD = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(WORLD, options={"gloo_reconfigure": True})
    c.spawn(*range(WORLD))
    yield c
    c.close()


def one_hot(rank: int) -> list[int]:
    return [1 if r == rank else 0 for r in range(WORLD)]


def total(ranks: list[int]) -> list[float]:
    return [float(sum(r + 1 for r in ranks))] * 4


def test_kill_one_of_four_the_survivors_reconfigure_their_backend_then_a_replacement_rejoins(
    cluster: Cluster,
) -> None:
    everyone = list(range(WORLD))
    cluster.ensure_full_view()
    assert all(r["ok"] for r in cluster.op(everyone, "all_reduce").values())
    before = {r: cluster.call(r, "gloo") for r in everyone}
    assert all(built == 1 for built, _ in before.values()), before

    # rank 2 dies while the others are in an all_reduce
    survivors = [0, 1, 3]
    cluster.start({r: ("op", ("all_reduce", {})) for r in survivors})
    cluster.kill(2)
    failed = cluster.collect(survivors)
    assert all(not r["ok"] and r["hint"] == one_hot(2) for r in failed.values()), failed

    # the survivors' view reconfigures a backend (the other of the pool where the failed view's
    # operation still ends on the first): rank 3 is in-view rank 2 now
    v = cluster.commit(survivors)
    recovered = cluster.op(survivors, "all_reduce")
    for rank, res in recovered.items():
        assert res["ok"] and res["out"] == total(survivors) and res["version"] == v, (rank, res)
    got = cluster.op(survivors, "broadcast", src=3)
    assert all(r["ok"] and r["out"] == [3.0] * 4 for r in got.values()), got
    for r in survivors:  # the view reconfigured a backend; at most a second one was made
        built, reconfigured = cluster.call(r, "gloo")
        assert built <= 2 and reconfigured == before[r][1] + 1, (r, built, reconfigured)

    # a replacement for rank 2 (a new process, its own new backend) rejoins the next view
    cluster.spawn(2)
    v = cluster.commit(everyone)
    rejoined = cluster.op(everyone, "all_reduce")
    for rank, res in rejoined.items():
        assert res["ok"] and res["out"] == total(everyone) and res["version"] == v, (rank, res)
    assert cluster.call(2, "gloo") == (1, 1)
    after = {r: cluster.call(r, "gloo") for r in survivors}
    assert all(built <= 2 and done == before[r][1] + 2 for r, (built, done) in after.items())
