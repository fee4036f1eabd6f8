"""Weight refit TP=2 -> TP=4 over NCCL, bit-identical, through a generator's SIGKILL.

The same scenario as ``tests/agent/test_refit_e2e.py`` (two trainer slots publish, four
generator slots receive resharded weights; a generator dies mid-transfer; the retry on the new
epoch completes, its replacement included), with NCCL worlds and the shards on the GPU
(``tests/agent/refit_worker.py`` with ``GPU_TEST_DEVICE``). The generators' received tensors are
hashed and compared with the trainers' weights resharded on the CPU: bit for bit.
"""

from __future__ import annotations

import pytest

from tests.agent import test_refit_e2e
from tests.agent.conftest import coordinator  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(240)


def test_tp2_trainers_refit_tp4_generators_over_nccl_through_a_kill(
    coordinator,  # noqa: F811
    tmp_path,
    monkeypatch,
) -> None:
    monkeypatch.setenv("GPU_TEST_DEVICE", "cuda:0")
    test_refit_e2e.test_tp2_trainers_refit_tp4_generators_then_a_generator_dies_and_the_retry_completes(
        coordinator, tmp_path
    )
