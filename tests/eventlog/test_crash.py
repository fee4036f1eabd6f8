"""Crash safety: a producer SIGKILLed at random moments never loses an acknowledged record.

A child process appends and reports every acknowledged offset; the parent kills it with
SIGKILL at a random moment (while it opens the log, creates the schema, or appends), 24 times
over the same file. After each kill the parent reopens the log and checks that every record
ever acknowledged is present, intact (checksums are verified by ``read``), in order, and that
offsets run from 1 to the head without a gap.
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

from foldplane.eventlog import open_log

CHILD = Path(__file__).with_name("crash_child.py")
ROOT = Path(__file__).resolve().parents[2]
KILLS = 24


def run_and_kill(
    db: Path, child: int, acks_first: int, extra_delay: float
) -> list[tuple[int, ...]]:
    """Start a producer; SIGKILL it once it reported ``acks_first`` acks and ``extra_delay`` passed.

    With ``acks_first == 0`` the kill comes ``extra_delay`` after the start, whatever the child
    is doing (starting Python, opening or creating the log). Returns every ack it reported.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(db), str(child)], stdout=subprocess.PIPE, env=env
    )
    lines: list[bytes] = []
    enough = threading.Event()

    def read() -> None:
        for line in iter(proc.stdout.readline, b""):
            lines.append(line)
            if len(lines) >= acks_first:
                enough.set()

    reader = threading.Thread(target=read)
    reader.start()
    if acks_first:
        assert enough.wait(timeout=120), f"producer {child} reported only {len(lines)} acks"
    time.sleep(extra_delay)  # the random moment itself; what it waits for is the kill
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the producer exited on its own"
    reader.join(timeout=30)
    acks = []
    for line in lines:
        if line.endswith(b"\n"):  # a line cut by the kill was never fully reported
            offset, c, task, n = map(int, line.split())
            acks.append((offset, c, task, n))
    return acks


async def verify(db: Path, acked: dict[int, tuple[int, int, int]]) -> int:
    log = await open_log(db, create=False)
    try:
        head = await log.head()
        offsets: list[int] = []
        after = 0
        while page := await log.read(after, limit=5000):
            for rec in page:
                offsets.append(rec.offset)
                if rec.offset in acked:
                    assert (rec.payload["child"], rec.payload["task"], rec.payload["n"]) == acked[
                        rec.offset
                    ], f"offset {rec.offset} holds another record than was acknowledged"
            after = page[-1].offset
        assert offsets == list(range(1, head + 1)), "offsets are not gap-free from 1 to the head"
        missing = sorted(set(acked) - set(offsets))
        assert not missing, f"acknowledged offsets lost after SIGKILL: {missing[:10]}"
        return head
    finally:
        await log.close()


@pytest.mark.slow
async def test_acknowledged_records_survive_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    rng = random.Random(20261129)
    acked: dict[int, tuple[int, int, int]] = {}
    for child in range(KILLS):
        # Every sixth kill lands at a random moment of the start (even while the schema is
        # created); the others once the producer is appending, after a random number of acks.
        if child % 6 == 0:
            acks = run_and_kill(db, child, 0, rng.uniform(0.0, 0.6))
        else:
            acks = run_and_kill(db, child, rng.randint(1, 400), rng.uniform(0.0, 0.05))
        for offset, c, task, n in acks:
            assert offset not in acked, f"offset {offset} was acknowledged twice"
            acked[offset] = (c, task, n)
        if db.exists():
            head = await verify(db, acked)
            assert head >= len(acked)
    assert len(acked) > 1000
