"""The contract: torchft-nightly's own ``torchft/manager_integ_test.py`` (shipped in its wheel),
its tests run with its in-process ``LighthouseServer`` swapped for a foldplane coordinator (a
real ``serve --lighthouse-port`` process on a SQLite log). Their managers, replica groups,
failures injected and checks are torchft's. One thing besides the lighthouse is changed, in
the tests' own setup: each replica's model draws its first weights from a generator of its own
(:class:`_SeededModel`), not from torch's global one. The replicas are threads of one process;
each seeds the global generator and builds its model under a lock, but a replica already in its
loop draws its batch (``torch.rand``) from that generator outside the lock, and can draw between
another's seed and its model: the replicas then start apart, which ``test_ddp_skip_init_sync``
(no weight sync at step 0) never mends. Seen once in three slow-suite runs under load, with
every quorum the lighthouse served naming both replicas at the same step and every step
committed by both; never in 58 runs of the test alone.

Afterwards each coordinator's log replays to the same quorums (``replay`` exits 0)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("torchft", reason="the torchft contract needs torchft-nightly (cp311)")
pytest.importorskip("parameterized", reason="torchft's manager_integ_test imports parameterized")

from torchft import manager_integ_test  # noqa: E402

from tests.lighthouse.coordinator import FoldplaneLighthouse  # noqa: E402
from tests.service.conftest import ROOT  # noqa: E402

# the managers of these tests listen on fixed ports (19530 + replica id): under -n 2 one worker
# runs them one at a time (tests/conftest.py's SERIAL scope; pytest ignores xdist_group marks)
pytestmark = pytest.mark.slow

_started: list[FoldplaneLighthouse] = []


class _SeededModel(manager_integ_test.MyModel):
    """torchft's test model, its first weights drawn as ``nn.Linear`` draws them (uniform within
    ``1/sqrt(fan_in)``) but from a generator seeded 42 of its own: every replica starts alike,
    whatever another replica's thread draws meanwhile from the global generator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        generator = torch.Generator().manual_seed(42)
        with torch.no_grad():
            for layer in self.layers:
                if isinstance(layer, torch.nn.Linear):
                    bound = 1.0 / math.sqrt(layer.in_features)
                    for param in (layer.weight, layer.bias):
                        param.copy_(
                            torch.empty(param.shape).uniform_(-bound, bound, generator=generator)
                        )


def _lighthouse(*args: object, **kwargs: object) -> FoldplaneLighthouse:
    lighthouse = FoldplaneLighthouse(*args, **kwargs)  # type: ignore[arg-type]
    _started.append(lighthouse)
    return lighthouse


@pytest.fixture(autouse=True)
def foldplane_lighthouse(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``LighthouseServer(...)`` of torchft's test module is a foldplane coordinator; the
    log of each one replays to what it served."""
    monkeypatch.setattr(manager_integ_test, "LighthouseServer", _lighthouse)
    monkeypatch.setattr(manager_integ_test, "MyModel", _SeededModel)
    yield
    while _started:
        lighthouse = _started.pop()
        lighthouse.shutdown()
        replay = subprocess.run(
            [sys.executable, "-m", "foldplane.coordinator", "replay", str(lighthouse.db)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stdout + replay.stderr
        lighthouse.cleanup()


class TestManagerIntegOnFoldplane(manager_integ_test.ManagerIntegTest):
    """torchft's ``ManagerIntegTest``, every test as it ships."""


def test_the_swap_reaches_torchfts_tests() -> None:
    assert manager_integ_test.LighthouseServer is _lighthouse
    assert manager_integ_test.MyModel is _SeededModel
    torch.manual_seed(0)
    first = _SeededModel().state_dict()
    torch.rand(5)  # what another replica's thread may draw meanwhile
    assert all(torch.equal(first[k], v) for k, v in _SeededModel().state_dict().items())
    assert Path(manager_integ_test.__file__).name == "manager_integ_test.py"
