"""torch's backend suite on foldplane: every test gloo passes passes on foldplane too, unless
foldplane declares it unsupported (``tests/torch_suite/declared.py``, each with its reason).

The gloo reference is the recorded run in ``docs/torch-compat-runs/<torch>/`` of the torch this
runs on (2.13.0+cpu and 2.14.1 are recorded); foldplane runs here, in a fresh interpreter,
against a real coordinator: at 2 processes every test gloo passes (the others cannot show a
difference), at 4 those whose outcome on gloo changes with the world size plus a core of
collectives and DDP. A test that fails is run once more on its own (the machine is shared and
slow; the page's recorded runs show every first failure); it must pass then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.torch_suite import harness, report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

#: At 4 processes, besides the tests whose gloo outcome differs from 2 processes.
CORE_AT_4 = (
    "test_all_reduce_sum",
    "test_broadcast",
    "test_all_gather",
    "test_all_reduce_sum_async",
    "test_barrier",
    "test_send_recv",
    "test_isend",
    "test_gather",
    "test_scatter",
    "test_all_gather_coalesced_simple",
    "test_all_reduce_coalesced_sum",
    "test_get_backend",
    "test_destroy_group",
    "test_get_rank_size_group",
    "test_DistributedDataParallel_requires_grad",
    "test_DistributedDataParallelCPU",
    "test_irecv",
    "test_accumulate_gradients_no_sync",
)


def _reference(world: int) -> dict:
    path = report.run_path(torch.__version__, "gloo", world)
    assert path.exists(), (
        f"no gloo reference is recorded for torch {torch.__version__} at {world} processes: "
        f"record it ({report.RECORD.format(backend='gloo', world=world, torch=torch.__version__)})"
    )
    run = json.loads(path.read_text())
    assert run["torch"] == torch.__version__, (path, run["torch"])
    return run


def _run_foldplane(world: int, names: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "tests.torch_suite", "--backend", "foldplane"]
    cmd += ["--world", str(world), "--timeout", "120", "--out", str(out)]
    for n in names:
        cmd += ["--test", n]
    done = subprocess.run(cmd, cwd=report.ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def _check(world: int, names: list[str], tmp_path: Path) -> None:
    gloo = _reference(world)
    first = _run_foldplane(world, names, tmp_path / f"foldplane-{world}.json")
    assert first["selected"] == len(names) == len(first["tests"])
    again = [t["test"] for t in harness.regressions(gloo, first)]
    if not again:
        return
    retry = _run_foldplane(world, again, tmp_path / f"foldplane-{world}-retry.json")
    left = harness.regressions(gloo, retry)
    assert not left, "gloo passes, foldplane does not (after one retry):\n" + "\n".join(
        f"  {t['test']}: {t['outcome']}: {t.get('detail', '')}" for t in left
    )


def test_every_test_gloo_passes_at_2_processes_passes_on_foldplane(tmp_path: Path) -> None:
    gloo = report.outcomes(_reference(2))
    _check(2, sorted(n for n, t in gloo.items() if t["outcome"] == "passed"), tmp_path)


def test_at_4_processes_the_world_size_dependent_tests_and_a_core_pass_on_foldplane(
    tmp_path: Path,
) -> None:
    two, four = report.outcomes(_reference(2)), report.outcomes(_reference(4))
    changed = {n for n in four if four[n]["outcome"] != two.get(n, {}).get("outcome")}
    passed = {n for n in four if four[n]["outcome"] == "passed"}
    _check(4, sorted((changed | set(CORE_AT_4)) & passed), tmp_path)
