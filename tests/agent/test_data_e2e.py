"""No sample lost to a dead rank, end to end: 4 gloo workers (real processes under the real
launcher) read an epoch of 20,000 indices through ``ElasticSampler`` and a ``DataLoader``;
one is SIGKILLed at about 30 % of the epoch, a replacement joins at about 60 %, and at the
epoch's end the indices the workers processed are the dataset exactly: none lost, none twice.

What "processed" means is the coordinator's: each worker writes a batch's indices *before*
marking it processed, so a SIGKILL leaves lines for batches it read but never reported; the
test folds the log (the real fold over the real SQLite file) to find how far each
incarnation's reports were accepted and keeps exactly those lines. The samples in a batch a
dead rank never reported are read again by the ranks that took its remainder (docs/data.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from foldplane.agent.launch import Launcher, WorkerExit
from foldplane.coordinator.fold.effects import Refused
from foldplane.coordinator.fold.machine import Coordinator as Fold
from foldplane.eventlog import open_log
from foldplane.facets.epochs.partition import split_at
from tests.agent.conftest import ROOT, Coordinator, _base_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("data_worker.py")
SIZE = 20_000
BATCH = 25
PACE_S = 0.05  # per batch: 200 batches a rank, about 10 s of reading with 4 ranks
#: per batch where a replacement must be activated while work is left: a replacement takes
#: up to 8 s to start and report ready on a loaded 2-core machine, and the survivors of a kill
#: at 40 % read the rest in about 16 s at this pace (7 s at ``PACE_S``)
REPLACEMENT_PACE_S = 0.1


class DataWorkers:
    def __init__(
        self,
        coordinator: Coordinator,
        group: str,
        out: Path,
        loader_workers: int,
        pace_s: float = PACE_S,
    ) -> None:
        self.coordinator, self.group, self.out = coordinator, group, out
        self.exits: queue.Queue[WorkerExit] = queue.Queue()
        self.events: dict[str, queue.Queue[dict[str, Any]]] = {}
        self.launcher = Launcher(
            [sys.executable, str(WORKER), str(out), str(SIZE), str(BATCH), str(pace_s),
             str(loader_workers)],
            coordinator=coordinator.url,
            group=group,
            ranks=range(4),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            on_exit=self.exits.put,
            env={"PYTHONPATH": str(ROOT), **_base_env()},
        )  # fmt: skip

    def spawn(self, rank: int) -> str:
        worker = self.launcher.spawn(rank)
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events[worker.incarnation] = q
        threading.Thread(target=_read, args=(worker.process, q), daemon=True).start()
        return worker.incarnation

    def expect(self, incarnation: str, event: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                got = self.events[incarnation].get(timeout=left)
                if got["event"] == event:
                    return got
                if got["event"] == "exited":
                    break
        raise AssertionError(f"incarnation {incarnation}: no {event!r} (see its output)")

    def activate(self, incarnation: str, rank: int) -> None:
        """Let a waiting replacement propose its activation."""
        stdin = self.launcher.worker(rank).process.stdin
        assert stdin is not None
        stdin.write(b"activate\n")
        stdin.flush()

    def processed(self) -> int:
        """How much of the epoch the coordinator has accepted as processed."""
        status = self.coordinator.client.request("GET", f"/groups/{self.group}/epochs")
        return status["dataset_size"] - status["unprocessed"]

    def wait_processed(self, fraction: float, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.processed() < fraction * SIZE:
            if time.monotonic() > deadline:
                raise AssertionError(f"the epoch did not reach {fraction:.0%} in {timeout} s")
            time.sleep(0.02)  # pacing the watch of real processes, not a stand-in for an event

    def kill(self, rank: int) -> None:
        self.launcher.kill(rank)
        while (gone := self.exits.get(timeout=30)).rank != rank:
            pass
        assert gone.returncode == -9 and gone.reported, gone


def _read(process: subprocess.Popen[bytes], q: queue.Queue[dict[str, Any]]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode(errors="replace").strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                q.put(json.loads(line))
    q.put({"event": "exited"})


def accepted_cursors(db: Path, group: str) -> dict[tuple[int, str], int]:
    """(rank, incarnation) -> the highest progress the fold accepted from it, by folding the
    log from offset 1 with the real fold."""

    async def fold() -> dict[tuple[int, str], int]:
        log = await open_log(db, create=False)
        machine = Fold()
        best: dict[tuple[int, str], int] = {}
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
                        key = (rec.rank, rec.payload["incarnation"])
                        best[key] = max(best.get(key, 0), rec.payload["processed"])
                after = page[-1].offset
        finally:
            await log.close()
        return best

    return asyncio.run(fold())


def counted_indices(db: Path, group: str) -> dict[int, list[int]]:
    """rank -> the dataset indices the fold counted processed for it at the epoch's end (its
    sequence up to its cursor, through the epoch's permutation), folding the log with the real
    fold."""

    async def fold() -> Fold:
        log = await open_log(db, create=False)
        machine = Fold()
        after = 0
        try:
            while page := await log.read(after, 5000):
                for rec in page:
                    machine.step(rec)
                after = page[-1].offset
        finally:
            await log.close()
        return machine

    e = asyncio.run(fold()).facet("epochs").epoch(group)
    assert e is not None
    perm = torch.randperm(e.plan.dataset_size, generator=torch.Generator().manual_seed(
        e.plan.seed + e.plan.epoch))  # fmt: skip
    out: dict[int, list[int]] = {}
    for rank, h in e.holdings.items():
        head = split_at(h.sequence, h.processed)[0]
        out[rank] = [int(perm[p]) for start, n in head for p in range(start, start + n)]
    return out


def read_indices(out: Path) -> dict[int, set[int]]:
    """rank -> every dataset index any process of that rank read (counted or not)."""
    read: dict[int, set[int]] = {}
    for path in out.glob("*.jsonl"):
        rank = int(path.stem.split("-", 1)[0])
        for line in path.read_text().splitlines():
            read.setdefault(rank, set()).update(json.loads(line)["indices"])
    return read


def processed_indices(out: Path, accepted: dict[tuple[int, str], int]) -> Counter[int]:
    """Every index of a batch whose cursor the coordinator accepted from its incarnation."""
    seen: Counter[int] = Counter()
    for path in out.glob("*.jsonl"):
        rank, incarnation = path.stem.split("-", 1)
        upto = accepted.get((int(rank), incarnation), 0)
        for line in path.read_text().splitlines():
            batch = json.loads(line)
            if batch["cursor"] <= upto:
                seen.update(batch["indices"])
    return seen


def run(
    coordinator: Coordinator,
    tmp_path: Path,
    group: str,
    script: Any,
    *,
    loader_workers: int = 0,
    pace_s: float = PACE_S,
) -> dict[tuple[int, str], int]:
    """Run ``script`` against 4 workers; check the epoch; the accepted cursors."""
    out = tmp_path / group
    out.mkdir()
    coordinator.create_group(group, 4)
    w = DataWorkers(coordinator, group, out, loader_workers, pace_s)
    try:
        first = {rank: w.spawn(rank) for rank in range(4)}
        for inc in first.values():
            w.expect(inc, "epoch")
        survivors = script(w, first)
        for inc in survivors:
            w.expect(inc, "done")
        accepted = accepted_cursors(coordinator.db, group)
        seen = processed_indices(out, accepted)
        lost = sorted(set(range(SIZE)) - set(seen))
        twice = sorted(i for i, n in seen.items() if n > 1)
        assert (len(lost), len(twice)) == (0, 0), f"lost {lost[:10]}, twice {twice[:10]}"
        assert sum(seen.values()) == SIZE
        status = coordinator.client.request("GET", f"/groups/{group}/epochs")
        assert status["status"] == "complete"
        return accepted
    finally:
        w.launcher.stop(grace_s=5)


@pytest.mark.parametrize("kill_at", [0.2, 0.25, 0.3, 0.35, 0.4])
def test_a_kill_and_a_replacement_lose_and_repeat_nothing(
    coordinator: Coordinator, tmp_path: Path, kill_at: float
) -> None:
    incarnations: dict[str, str] = {}

    def script(w: DataWorkers, first: dict[int, str]) -> list[str]:
        w.wait_processed(kill_at)
        w.kill(2)
        replacement = w.spawn(2)
        w.expect(replacement, "waiting")
        # after the survivors took over the dead rank's part, with half the epoch or more left:
        # the replacement's activation must land while there is still work to share
        w.wait_processed(kill_at + 0.1)
        w.activate(replacement, 2)
        incarnations.update(dead=first[2], replacement=replacement)
        return [first[0], first[1], first[3], replacement]

    accepted = run(
        coordinator, tmp_path, f"kill{int(kill_at * 100)}", script, pace_s=REPLACEMENT_PACE_S
    )
    # the replacement read a share of its own (its cursor went on from the dead one's)
    assert accepted[(2, incarnations["replacement"])] > accepted[(2, incarnations["dead"])]


def test_two_kills_lose_and_repeat_nothing(coordinator: Coordinator, tmp_path: Path) -> None:
    def script(w: DataWorkers, first: dict[int, str]) -> list[str]:
        w.wait_processed(0.25)
        w.kill(1)
        w.wait_processed(0.5)
        w.kill(3)
        return [first[0], first[2]]

    run(coordinator, tmp_path, "twokills", script)


def test_a_rank_deactivated_by_proposal_loses_and_repeats_nothing(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    def script(w: DataWorkers, first: dict[int, str]) -> list[str]:
        w.wait_processed(0.3)
        proposal = coordinator.client.propose(w.group, "deactivate", [1], wait_s=30)
        assert proposal["status"] == "applied", proposal
        return [first[0], first[2], first[3]]

    run(coordinator, tmp_path, "deactivate", script)


def test_a_loader_with_worker_processes_loses_and_repeats_nothing(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    def script(w: DataWorkers, first: dict[int, str]) -> list[str]:
        w.wait_processed(0.3)
        w.kill(0)
        return [first[1], first[2], first[3]]

    run(coordinator, tmp_path, "loader", script, loader_workers=1)


DR_SIZE = 4_000
DR_BATCH = 10
DR_PACE_S = 0.04  # per batch: 100 batches a rank, about 4 s of reading with 4 ranks


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rank_deactivated_and_activated_again_counts_only_what_it_read(
    coordinator: Coordinator, tmp_path: Path, seed: int
) -> None:
    """The schedule of docs/data.md's promise "whatever the view history": 4 workers on
    ``ElasticSampler`` under ``python -m foldplane.agent.launch --replace-failed``; at about 23 % of the
    epoch rank 0 is deactivated by proposal, at about 50 % activated again, its process running
    throughout. At the end, every index is counted processed exactly once (the fold's parts)
    and each was read by the rank it is counted for: a report made before the reassignment
    is never credited to the share given after it."""
    group = f"react{seed}"
    out = tmp_path / group
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    env.update(_base_env())
    env["PYTHONPATH"] = str(ROOT)
    launch = subprocess.Popen(
        [sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url,
         "--group", group, "--world-size", "4", "--nproc", "4", "--replace-failed",
         str(WORKER), str(out), str(DR_SIZE), str(DR_BATCH), str(DR_PACE_S), "0", str(seed)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output: list[str] = []
    reader = threading.Thread(
        target=lambda: output.extend(launch.stdout or []), daemon=True
    )  # the launcher's output, for the failure message
    reader.start()

    def processed() -> float:
        with contextlib.suppress(Exception):
            status = coordinator.client.request("GET", f"/groups/{group}/epochs")
            return 1 - status["unprocessed"] / status["dataset_size"]
        return 0.0

    def wait_for(fraction: float) -> None:
        deadline = time.monotonic() + 120
        while processed() < fraction:
            assert launch.poll() is None, "".join(output[-60:])
            assert time.monotonic() < deadline, f"the epoch did not reach {fraction:.0%}"
            time.sleep(0.02)  # pacing the watch of real processes, not a stand-in for an event

    try:
        wait_for(0.23)
        off = coordinator.client.propose(group, "deactivate", [0], wait_s=30)
        assert off["status"] == "applied", off
        wait_for(0.50)
        on = coordinator.client.propose(group, "activate", [0], wait_s=30)
        assert on["status"] == "applied", on
        assert launch.wait(timeout=180) == 0, "".join(output[-60:])
    finally:
        if launch.poll() is None:
            launch.terminate()
            launch.wait(timeout=30)
    status = coordinator.client.request("GET", f"/groups/{group}/epochs")
    assert status["status"] == "complete", status
    counted = counted_indices(coordinator.db, group)
    everything = [i for indices in counted.values() for i in indices]
    assert sorted(everything) == list(range(DR_SIZE))  # counted exactly once
    read = read_indices(out)
    for rank, indices in sorted(counted.items()):
        never = sorted(set(indices) - read.get(rank, set()))
        assert never == [], f"rank {rank} is counted for {len(never)} indices it never read"
    # rank 0 really read a share after its reactivation
    views = [v["active_ranks"] for v in coordinator.history(group)]
    assert [1, 2, 3] in views and views[-1] == [0, 1, 2, 3], views
