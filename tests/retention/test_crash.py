"""kill -9 during compaction: nothing is lost, the log opens, and the next run finishes.

A real in-process ``Host`` writes a group's life with thousands of heartbeats to a SQLite file.
Then ``python -m coordinator compact`` runs as a child process in small steps and is killed
with SIGKILL at a random moment: during its start or its verifying fold (a random delay), or
right after its k-th step committed (it prints a line per step). After every kill the parent
opens the log and checks every record of the original log: present and unchanged, or inside a
removed range whose count matches what is missing there; every record that was not removable
is present; the kept snapshots cover every removed range. A last run completes, and replay
agrees with the projections.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.loop import CONSUMER, Host
from foldplane.coordinator.host.replay import replay_log
from foldplane.coordinator.host.retention import removable
from foldplane.coordinator.host.snapshots import decode_snapshot
from foldplane.eventlog import Record, open_log
from tests.retention.history import Life
from tests.retention.test_compaction import everything

ROOT = Path(__file__).resolve().parents[2]
KILLS = 10
STEP = 2


def compact_and_kill(db: Path, *, after_steps: int, delay: float) -> tuple[int, list[str]]:
    """Run a compaction; SIGKILL it ``delay`` s after its ``after_steps``-th step line (or
    after its start, with 0). Returns its exit status and the step lines it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "foldplane.coordinator", "compact", str(db), "--step", str(STEP)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: list[str] = []
    enough = threading.Event()

    def read() -> None:
        for line in iter(proc.stdout.readline, b""):
            if line.startswith(b"step:"):
                lines.append(line.decode())
                if len(lines) >= after_steps:
                    enough.set()
        enough.set()  # the run ended by itself

    reader = threading.Thread(target=read)
    reader.start()
    if after_steps:
        assert enough.wait(timeout=120), "the compaction printed no step"
    time.sleep(delay)  # the random moment itself; what it waits for is the kill
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    status = proc.wait(timeout=60)
    reader.join(timeout=30)
    return status, lines


async def check(db: Path, before: dict[int, Record], must_stay: set[int]) -> int:
    """The invariants after a kill; returns how many records are removed so far."""
    log = await open_log(db, create=False)  # the log opens
    try:
        present = {r.offset: r for r in await everything(log)}
        ranges = await log.removed_ranges()
        kept = await log.kept_snapshots(CONSUMER)
        if kept:  # the newest kept snapshot is always a whole state a fold can start from
            decode_snapshot(await log.load_kept_snapshot(CONSUMER, kept[-1]) or b"")
        assert await log.head() >= max(before)
    finally:
        await log.close()
    for offset, rec in present.items():
        if offset in before:
            assert rec == before[offset], f"offset {offset} changed"
    missing = {o for o in before if o not in present}
    assert not missing & must_stay, (
        f"records that decided something are gone: {missing & must_stay}"
    )
    accounted = 0
    for r in ranges:
        span = {o for o in range(r.first, r.last + 1) if o not in present}
        assert len(span) == r.removed, f"range {r} does not count what is missing in it"
        assert any(k >= r.last for k in kept), f"range {r} lies behind no kept snapshot"
        accounted += len(span)
    assert accounted == len(missing), "an offset is missing outside every removed range"
    return len(missing)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ten kills at random moments, each followed by a reopen and a check
async def test_kill_9_during_compaction_loses_nothing_and_the_next_run_finishes(tmp_path):
    db = tmp_path / "log.db"
    # beats appended at once: at the default flush every round of beats would wait half a second
    host = await Host.open(str(db), snapshot_every=1000, heartbeat_flush_s=0)
    life = Life(host)
    await life.live()
    await life.beats(1200, ranks=[0, 1, 3])  # thousands of removable heartbeats
    await host.close()
    log = await open_log(db)
    try:
        records = await everything(log)
    finally:
        await log.close()
    before = {r.offset: r for r in records}
    fold = Coordinator()
    removable_offsets = {r.offset for r in records if removable(r, fold.step(r))}
    must_stay = set(before) - removable_offsets
    assert len(removable_offsets) > 40 * STEP

    rng = random.Random(20261201)
    removed, interrupted = 0, 0
    for kill in range(KILLS):
        if kill % 3 == 0:  # at a random moment of its start or its verifying fold
            status, steps = compact_and_kill(db, after_steps=0, delay=rng.uniform(0.0, 0.8))
        else:  # while it removes, between or inside steps
            status, steps = compact_and_kill(
                db, after_steps=rng.randint(1, 8), delay=rng.uniform(0.0, 0.005)
            )
        now = await check(db, before, must_stay)
        assert now >= removed
        if status == -signal.SIGKILL and removed < now < len(removable_offsets):
            interrupted += 1
        removed = now
    assert interrupted >= 3, "too few kills landed while a compaction was removing records"

    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "compact", str(db), "--step", str(STEP)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert await check(db, before, must_stay) == len(removable_offsets)  # the job is finished
    log = await open_log(db)
    try:
        report = await replay_log(log)
    finally:
        await log.close()
    assert report.ok, report.divergences
    assert [v["version"] for v in report.views] == [1, 2, 3, 4]
