"""``examples/train_fsdp.py`` as its docstring runs it: two replicas of two shards, replica 1
SIGKILLed mid-run, a replacement replica that heals; every shard index ends identical."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.agent.conftest import ROOT
from tests.agent.conftest import coordinator as coordinator  # noqa: PLC0414 (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_train_fsdp_loses_a_replica_heals_its_replacement_and_ends_identical(coordinator):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "examples/train_fsdp.py",
                "--coordinator",
                coordinator.url,
                "--group",
                "hsdp",
                "--replicas",
                "2",
                "--shards",
                "2",
                "--replica",
                str(r),
                "--steps",
                "30",
                "--kill-replica",
                "1",
                "--kill-at",
                "10",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    outs = []
    for run in runs:
        try:
            out, _ = run.communicate(timeout=360)
        except subprocess.TimeoutExpired:
            for r in runs:
                r.kill()
            raise AssertionError("the example did not finish") from None
        assert run.returncode == 0, out
        outs.append(out)
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
        assert [0] in views and views[-1] == [0, 1], views
