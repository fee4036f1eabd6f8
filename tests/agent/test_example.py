"""``examples/train_ddp.py`` as its docstring runs it: the launcher, 4 gloo workers, one
SIGKILLed mid-run, a replacement that heals; every rank ends with the same parameters."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.agent.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_train_ddp_survives_a_kill_heals_the_replacement_and_ends_identical(coordinator):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    try:
        run = subprocess.run(
            [sys.executable, "-m", "agent.launch", "--coordinator", coordinator.url,
             "--group", "train", "--world-size", "4", "--nproc", "4", "--replace-failed",
             "examples/train_ddp.py", "--steps", "60", "--kill-rank", "2", "--kill-at", "10"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=240,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the example did not finish: {exc.stdout}") from None
    out = run.stdout
    assert run.returncode == 0, out
    assert "rank 2: SIGKILL at step 10" in out and "killed by SIGKILL" in out, out
    done = re.findall(
        r"rank (\d): done at step (\d+) \(joined at (\d+), \d+ skipped\); "
        r"loss ([0-9.]+) -> ([0-9.]+); params ([0-9a-f]+)",
        out,
    )
    assert sorted(int(d[0]) for d in done) == [0, 1, 2, 3], out
    (last,) = {int(d[1]) for d in done}  # every rank stopped at the same step...
    assert last >= 60, done  # ...once all four had committed one together
    assert len({d[5] for d in done}) == 1, done  # identical parameters on every rank
    joined = {int(d[0]): int(d[2]) for d in done}
    assert joined[2] > 10 and all(joined[r] == 0 for r in (0, 1, 3)), joined
    for d in done:
        if d[0] != "2":  # the replacement's first loss is already a trained model's
            assert float(d[4]) < float(d[3]) / 2, d  # the loss fell
    views = [v["active_ranks"] for v in coordinator.history("train")]
    assert [0, 1, 3] in views and views.index([0, 1, 3]) < len(views) - 1, views
