"""Every collective's result is right when read right after ``wait()``, on the caller's stream.

torch's contract for a GPU operation: once ``wait()`` returned (or the synchronous call, or the
future completed), whatever the caller enqueues on its current stream sees the result. Each
result here is read with ``.tolist()`` (a copy on the current stream), never after a
``torch.cuda.synchronize()``: an operation that was not ordered before it reads old contents.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dataplane.cluster import Cluster
from tests.gpu import worker
from tests.gpu.conftest import GPU_OPTIONS, HAS_CUDA

N = 1 << 18  # large enough that NCCL over loopback takes far longer than the read


@pytest.fixture(scope="module")
def four() -> Iterator[Cluster]:
    """Four GPU workers in one view, shared by the tests of this module (none kills a rank)."""
    if not HAS_CUDA:
        pytest.skip("no CUDA device")
    cluster = Cluster(4, GPU_OPTIONS, target=worker.main)
    try:
        cluster.spawn(0, 1, 2, 3)
        cluster.commit([0, 1, 2, 3])
        yield cluster
    finally:
        cluster.close()


@pytest.mark.parametrize("mode", ["async", "sync", "future", "then"])
def test_all_reduce_broadcast_gather_scatter_results_are_ordered_before_the_callers_stream(
    four, mode: str
) -> None:
    ranks = [0, 1, 2, 3]
    scale = 2.0 if mode == "then" else 1.0
    ar = four.op(ranks, "all_reduce", numel=N, mode=mode, enqueue_after=True)
    for r in ranks:
        assert ar[r]["ok"], ar[r]
        assert ar[r]["out"] == [10.0 * scale, 10.0 * scale]
        if mode != "then":
            assert ar[r]["after"] == [30.0, 30.0]  # a kernel enqueued after wait() sees it
        assert ar[r]["hint"] == [0, 0, 0, 0]
        assert ar[r]["hint_device"].startswith("cuda")
    bc = four.op(ranks, "broadcast", numel=N, mode=mode, src=2)
    assert all(bc[r]["ok"] and bc[r]["out"] == [2.0 * scale] * 2 for r in ranks), bc
    ag = four.op(ranks, "all_gather", numel=N, mode=mode)
    for r in ranks:
        assert ag[r]["ok"]
        assert ag[r]["out"] == [[float(j) * scale] * 2 for j in ranks], ag[r]
    rs = four.op(ranks, "reduce_scatter", numel=N, mode=mode)
    for r in ranks:
        expected = float(sum(j * 10 + r for j in ranks)) * scale
        assert rs[r]["ok"] and rs[r]["out"] == [expected, expected], rs[r]


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_send_recv_and_coalesced_results_are_ordered(four, mode: str) -> None:
    four.start({0: ("op", ("send", {"dst": 3, "numel": N, "mode": mode}))})
    four.start({3: ("op", ("recv", {"src": 0, "numel": N, "mode": mode}))})
    got = four.collect([0, 3])
    assert got[0]["ok"] and got[3]["ok"], got
    assert got[3]["out"] == [100.0, 100.0]
    co = four.op([0, 1, 2, 3], "allreduce_coalesced", numel=N, mode=mode)
    for r in range(4):
        assert co[r]["ok"]
        assert co[r]["out"] == [[10.0 + 4 * i] * 2 for i in range(3)], co[r]


def test_cpu_and_cuda_tensors_in_one_view(four) -> None:
    ranks = [0, 1, 2, 3]
    for device in ("cpu", "cuda", "cpu", "cuda"):
        got = four.op(ranks, "all_reduce", numel=1024, device=device)
        for r in ranks:
            assert got[r]["ok"] and got[r]["out"] == [10.0, 10.0], (device, got[r])
            assert got[r]["hint_device"].startswith("cpu" if device == "cpu" else "cuda")
    barrier = four.op(ranks, "barrier")
    assert all(barrier[r]["ok"] for r in ranks)
