"""``examples/train_fsdp.py`` as its docstring runs it: two replicas of two shards, replica 1
SIGKILLed mid-run, a replacement replica that heals; every shard index ends identical."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.agent.conftest import ROOT
from tests.agent.conftest import coordinator as coordinator  # noqa: PLC0414 (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_train_fsdp_loses_a_replica_heals_its_replacement_and_ends_identical(coordinator, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    logs = [tmp_path / f"replica-{r}.log" for r in range(2)]
    runs = []
    for r, path in enumerate(logs):
        argv = [sys.executable, "examples/train_fsdp.py", "--coordinator", coordinator.url,
                "--group", "hsdp", "--replicas", "2", "--shards", "2", "--replica", str(r),
                "--steps", "30", "--kill-replica", "1", "--kill-at", "10"]  # fmt: skip
        with open(path, "wb") as log:
            # A session of its own: its shard processes too can be stopped at once.
            run = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        runs.append(run)
    deadline = time.monotonic() + 300
    try:
        codes = [run.wait(timeout=max(0.0, deadline - time.monotonic())) for run in runs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for run in runs:  # whatever is left, the shard processes included
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    outs = [path.read_text(errors="replace") for path in logs]
    both = "\n".join(f"--- replica {r} ---\n{o}" for r, o in enumerate(outs))
    assert codes is not None, f"the example did not finish:\n{both}"
    assert codes == [0, 0], both
    out = "\n".join(outs)
    assert "replica 1 shard 0: SIGKILL at step 10" in out and "the replica is lost" in out, out
    done = re.findall(
        r"replica (\d) shard (\d): done at step (\d+) \(joined at (\d+), (\d+) skipped\); "
        r"loss ([0-9.]+) -> ([0-9.]+); shards ([0-9a-f]+)",
        out,
    )
    assert sorted((d[0], d[1]) for d in done) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    (last,) = {int(d[2]) for d in done}  # every process stopped at the same step...
    assert last >= 30, done  # ...once both replicas had committed one together
    for shard in "01":  # each shard index bit-identical on both replicas
        assert len({d[7] for d in done if d[1] == shard}) == 1, done
    assert all(int(d[3]) > 10 for d in done if d[0] == "1"), done  # the replacement healed
    assert all(int(d[4]) >= 1 for d in done if d[0] == "0"), done  # the failed step skipped
    for d in done:
        if d[0] == "0":
            assert float(d[6]) < float(d[5]), d  # the loss fell
    for shard in range(2):
        views = [v["active_ranks"] for v in coordinator.history(f"hsdp-s{shard}")]
        # Replica 1 left, its replacement was activated (the clean exits at the end shrink
        # the view again, in whatever order the processes closed).
        assert [0] in views and [0, 1] in views[views.index([0]) :], views
