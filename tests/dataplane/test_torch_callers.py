"""torch's own callers of a registered foldplane group, across real processes: functional
collectives and DTensor (their C++ ops call the group's ``all_gather_single_coalesced``,
``reduce_scatter_single_coalesced``, ``all_to_all_single``), the coalescing manager (its
``_start_coalescing``/``_end_coalescing`` reach the group from C++ on torch 2.14),
``batch_isend_irecv`` (which torch 2.14 coalesces through the group) and ``dist.all_to_all``.

Two worker processes, each with its data plane's group registered as torch's default group;
the test process hosts the store and commits the view (``tests/dataplane/cluster.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.dataplane import callers_worker
from tests.dataplane.cluster import Cluster

WORLD = 2
RANKS = list(range(WORLD))
TORCH_2_14 = tuple(int(n) for n in torch.__version__.split(".")[:2]) >= (2, 14)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(WORLD, target=callers_worker.main)
    # a first call imports torch's functional collectives and DTensor: on a loaded 2-core
    # machine that alone has taken 20 s and more
    c.reply_timeout_s = 240.0
    c.spawn(*RANKS)
    c.commit(RANKS)
    names = c.call_all({r: ("adopt", ()) for r in RANKS})
    assert len(set(names.values())) == 1, names
    yield c
    c.close()


def _call(cluster: Cluster, name: str) -> dict[int, dict]:
    got = cluster.call_all({r: ("call", (name,)) for r in RANKS})
    cluster.commit(RANKS)  # the next test starts on a fresh view, whatever this one left
    return got


def test_functional_collectives_run_on_the_group(cluster: Cluster) -> None:
    got = _call(cluster, "funcol")
    for r in RANKS:
        assert got[r]["all_gather_tensor"] == [0.0, 0.0, 1.0, 1.0]
        # rank q's input is arange(4) + q: slot r summed over q = 0, 1
        assert got[r]["reduce_scatter_tensor"] == [4.0 * r + 1, 4.0 * r + 3]
        assert got[r]["all_to_all_single"] == [float(r), 10.0 + r]


def test_dtensor_redistributes_over_the_group(cluster: Cluster) -> None:
    got = _call(cluster, "dtensor")
    whole = [float(v) for v in range(4 * WORLD)]
    for r in RANKS:
        assert got[r]["full_tensor"] == whole
        assert got[r]["replicated"] == whole
        assert got[r]["column_shard"] == whole[r::2]  # column r of the 4 x 2 tensor


@pytest.mark.skipif(
    not TORCH_2_14, reason="torch 2.13's C++ does not call a Python group's start_coalescing"
)
def test_the_coalescing_manager_runs_on_the_group(cluster: Cluster) -> None:
    got = _call(cluster, "coalescing_manager")
    for r in RANKS:
        assert got[r]["all_reduce"] == [[2.0, 2.0], [1.0]]
        assert got[r]["all_gather"] == [[0.0, 0.0, 1.0, 1.0], [1.0, 1.0]]
        assert got[r]["works"] == ["Work"]  # one real work for the region (not a null one)


def test_batch_isend_irecv_runs_on_the_group(cluster: Cluster) -> None:
    got = _call(cluster, "batch_isend_irecv")
    for r in RANKS:
        assert all(got[r]["waited"]) and got[r]["waited"], got[r]
        assert got[r]["got"] == [float((r - 1) % WORLD)] * 2


def test_all_to_all_runs_on_the_group(cluster: Cluster) -> None:
    got = _call(cluster, "all_to_all")
    for r in RANKS:
        assert got[r]["all_to_all"] == [[10.0 * q + r] * (q + 1) for q in RANKS]
        assert got[r]["all_to_all_single"] == [float(r), 10.0 + r]
