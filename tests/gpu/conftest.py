"""The GPU suite: real NCCL on a real GPU. Skipped, with the reason, where torch sees no GPU.

Run it on a GPU machine with ``scripts/gpu-check`` (it records a summary in docs/gpu-runs/).
Several ranks share one GPU here (``tests/gpu/worker.py`` says how): that is a test arrangement.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.dataplane.cluster import Cluster
from tests.gpu import worker

HAS_CUDA = torch.cuda.is_available()
NO_GPU = "the GPU suite needs a CUDA device, and torch sees none (run it with scripts/gpu-check)"

#: Deadlines long enough for NCCL's first connection on a loaded machine, far above the
#: failure-detection bounds the tests assert (a test that waited out a deadline fails).
GPU_OPTIONS = {
    "collective_timeout_s": 30.0,
    "p2p_timeout_s": 30.0,
    "liveness_period_s": 0.1,
    "liveness_window_periods": 3,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/gpu/"):
            item.add_marker(pytest.mark.cuda)
            if not HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture
def gpu_cluster() -> Iterator:
    """A factory of clusters of GPU workers (NCCL data planes on cuda:0); all closed at the end."""
    made: list[Cluster] = []

    def make(world_size: int = 4, **options: object) -> Cluster:
        cluster = Cluster(world_size, {**GPU_OPTIONS, **options}, target=worker.main)
        made.append(cluster)
        cluster.spawn(*range(world_size))
        return cluster

    yield make
    for cluster in made:
        cluster.close()
