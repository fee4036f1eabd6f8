"""``examples/train_ddp.py`` as its docstring runs it: the launcher, 4 gloo workers reading
their parts of each epoch through ``ElasticSampler`` and a ``DataLoader`` with a worker
process, one SIGKILLed mid-epoch, a replacement that heals; every rank ends with the same
parameters, and every epoch's samples were processed exactly once across the ranks.

"Processed" is the coordinator's, as in tests/agent/test_data_e2e.py: the example writes a
batch's indices before marking it processed, and the test keeps the lines whose cursor the
fold accepted from that incarnation (a batch the killed rank trained on and never reported is
read again by the rank that took its remainder)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from foldplane.coordinator.fold.effects import Refused
from foldplane.coordinator.fold.machine import Coordinator as Fold
from foldplane.eventlog import open_log
from tests.agent.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SIZE = 2048


def accepted_cursors(db: Path, group: str) -> dict[tuple[int, int, str], int]:
    """(epoch, rank, incarnation) -> the highest progress the fold accepted from it."""

    async def fold() -> dict[tuple[int, int, str], int]:
        log = await open_log(db, create=False)
        machine = Fold()
        best: dict[tuple[int, int, str], int] = {}
        after = 0
        try:
            while page := await log.read(after, 5000):
                for rec in page:
                    effects = machine.step(rec)
                    if (
                        rec.kind == "progress"
                        and rec.group == group
                        and not any(isinstance(e, Refused) for e in effects)
                    ):
                        p = rec.payload
                        key = (p["epoch"], rec.rank, p["incarnation"])
                        best[key] = max(best.get(key, 0), p["processed"])
                after = page[-1].offset
        finally:
            await log.close()
        return best

    return asyncio.run(fold())


def processed_per_epoch(
    out: Path, accepted: dict[tuple[int, int, str], int]
) -> dict[int, Counter[int]]:
    seen: dict[int, Counter[int]] = {}
    for path in out.glob("*.jsonl"):
        rank, incarnation = path.stem.split("-", 1)
        for line in path.read_text().splitlines():
            batch = json.loads(line)
            epoch = batch["epoch"]
            if batch["cursor"] <= accepted.get((epoch, int(rank), incarnation), 0):
                seen.setdefault(epoch, Counter()).update(batch["indices"])
    return seen


def test_train_ddp_survives_a_kill_heals_the_replacement_and_ends_identical(coordinator, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    record = tmp_path / "processed"
    record.mkdir()
    try:
        run = subprocess.run(
            [sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url,
             "--group", "train", "--world-size", "4", "--nproc", "4", "--replace-failed",
             "examples/train_ddp.py", "--epochs", "2", "--dataset-size", str(SIZE),
             "--workers", "1", "--kill-rank", "2", "--kill-at", "6", "--record", str(record)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=240,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        # the output is bytes here whatever ``text`` says; its end says where the run stopped
        raw = exc.stdout or b""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        try:
            views = [(v["version"], v["active_ranks"], v["cause"]["kind"])
                     for v in coordinator.history("train")]  # fmt: skip
            where = f"views: {views}\nstatus: {coordinator.status('train')}"
        except Exception as e:  # the coordinator itself may be what hung
            where = f"the coordinator did not answer: {e!r}"
        tail = "\n".join(text.splitlines()[-120:])
        raise AssertionError(
            f"the example did not finish; its last lines:\n{tail}\n{where}"
        ) from None
    out = run.stdout
    assert run.returncode == 0, out
    assert "rank 2: SIGKILL at step 6" in out and "killed by SIGKILL" in out, out
    # one numbering: killed after step 6 committed, each survivor skips step 7 (the batch goes
    # again) and says so once, naming whom the failed operation blamed, or why it skipped
    # when its own operations blamed nobody (never an empty "failed ranks []")
    skipped = re.findall(r"rank ([013]): step 7 of view 1 skipped on every member "
                         r"\((failed ranks \[\d+\]|view \d+ committed during it|"
                         r"another member's operation failed)\)", out)  # fmt: skip
    assert sorted(r for r, _ in skipped) == ["0", "1", "3"], out
    assert any(why == "failed ranks [2]" for _, why in skipped), out
    assert "failed ranks []" not in out, out
    assert "step skipped; hint" not in out  # the library's line is the one line
    assert not re.search(r"rank \d+: [^\n]*rank \d+: ", out), out  # no two lines run together
    done = re.findall(
        r"rank (\d): done at step (\d+) \(joined at (\d+), \d+ skipped\); "
        r"loss ([0-9.]+|nan) -> ([0-9.]+|nan); params ([0-9a-f]+)",  # nan: it trained no batch
        out,
    )
    assert sorted(int(d[0]) for d in done) == [0, 1, 2, 3], out
    assert len({int(d[1]) for d in done}) == 1, done  # every rank stopped at the same step
    assert len({d[5] for d in done}) == 1, done  # identical parameters on every rank
    joined = {int(d[0]): int(d[2]) for d in done}
    assert joined[2] > 6 and all(joined[r] == 0 for r in (0, 1, 3)), joined
    for d in done:
        if d[0] != "2":  # the replacement's first loss is already a trained model's
            assert float(d[4]) < float(d[3]) / 2, d  # the loss fell
    views = [v["active_ranks"] for v in coordinator.history("train")]
    assert [0, 1, 3] in views and views.index([0, 1, 3]) < len(views) - 1, views

    # every epoch's samples, across the ranks and incarnations, are the dataset exactly
    seen = processed_per_epoch(record, accepted_cursors(coordinator.db, "train"))
    assert len(seen) >= 2, sorted(seen)
    for epoch, counts in sorted(seen.items()):
        lost = sorted(set(range(SIZE)) - set(counts))
        twice = sorted(i for i, n in counts.items() if n > 1)
        assert (len(lost), len(twice)) == (0, 0), (epoch, lost[:10], twice[:10])
    status = coordinator.client.request("GET", "/groups/train/epochs")
    assert status["status"] == "complete" and status["epoch"] == max(seen)
    # the killed incarnation's file holds batches of epoch 0 it never reported: read again
    files = {p.stem.split("-")[0] for p in record.glob("*.jsonl")}
    assert files == {"0", "1", "2", "3"} and len(list(record.glob("2-*.jsonl"))) == 2


def test_the_ddp_command_run_twice_against_one_coordinator(coordinator, tmp_path):
    """The README's DDP command, run again against the same coordinator: the launcher refuses
    at once (the group finished; its history stays) and says what to do; under another
    --group the same command runs, and the first run's views are still there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}

    def launch(group: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url,
             "--group", group, "--world-size", "4", "--nproc", "4", "--replace-failed",
             "examples/train_ddp.py", "--epochs", "1", "--dataset-size", "256",
             "--workers", "0"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=240,
        )  # fmt: skip

    first = launch("train")
    assert first.returncode == 0, first.stdout
    assert "created group 'train'" in first.stdout, first.stdout
    views = [v["version"] for v in coordinator.history("train")]

    again = launch("train")
    assert again.returncode == 2, again.stdout
    assert "group 'train' finished; view" in again.stdout, again.stdout
    assert "start this run under another --group" in again.stdout, again.stdout
    assert "rank 0" not in again.stdout  # no worker started

    other = launch("train-2")
    assert other.returncode == 0, other.stdout
    assert re.search(r"rank 0: done at step \d+", other.stdout), other.stdout
    assert [v["version"] for v in coordinator.history("train")] == views  # kept, untouched
