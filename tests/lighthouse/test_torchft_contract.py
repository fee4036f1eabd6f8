"""The contract: torchft-nightly's own ``torchft/manager_integ_test.py`` (shipped in its wheel),
its tests run with its in-process ``LighthouseServer`` swapped for a foldplane coordinator (a
real ``serve --lighthouse-port`` process on a SQLite log). Nothing else of the tests changes:
their managers, replica groups, failures injected and checks are torchft's.

Afterwards each coordinator's log replays to the same quorums (``replay`` exits 0)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torchft", reason="the torchft contract needs torchft-nightly (cp311)")
pytest.importorskip("parameterized", reason="torchft's manager_integ_test imports parameterized")

from torchft import manager_integ_test  # noqa: E402

from tests.lighthouse.coordinator import FoldplaneLighthouse  # noqa: E402
from tests.service.conftest import ROOT  # noqa: E402

# the managers of these tests listen on fixed ports (19530 + replica id): under -n 2 one worker
# runs them one at a time (tests/conftest.py's SERIAL scope; pytest ignores xdist_group marks)
pytestmark = pytest.mark.slow

_started: list[FoldplaneLighthouse] = []


def _lighthouse(*args: object, **kwargs: object) -> FoldplaneLighthouse:
    lighthouse = FoldplaneLighthouse(*args, **kwargs)  # type: ignore[arg-type]
    _started.append(lighthouse)
    return lighthouse


@pytest.fixture(autouse=True)
def foldplane_lighthouse(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``LighthouseServer(...)`` of torchft's test module is a foldplane coordinator; the
    log of each one replays to what it served."""
    monkeypatch.setattr(manager_integ_test, "LighthouseServer", _lighthouse)
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
    assert Path(manager_integ_test.__file__).name == "manager_integ_test.py"
