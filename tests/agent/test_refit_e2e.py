"""A weight refit end to end, control plane and data plane: 2 trainer ranks (a small model,
TP=2) refit 4 generator ranks (TP=4) over gloo through a real coordinator; then a generator is
SIGKILLed mid-transfer, the refit reports who died, and the retry on the new view (with the
launcher's replacement) completes. Every generator's tensors equal the trainers' exactly.
The same when the one that dies is publisher slot 0, which hosts the world's store: the
coordinator's verdict (the refit's epoch moved) fails the attempt on every generator within
seconds, naming slot 0, not at the store's timeout.

Real processes throughout: the coordinator server, two launchers (one per group; the
generators' replaces a failed worker), and the workers of ``refit_worker.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from foldplane.agent.launch import Launcher, WorkerExit
from foldplane.coordinator.fold.machine import Coordinator as Fold
from foldplane.eventlog import open_log
from foldplane.facets.refits.effects import (
    TransferChanged,
)
from tests.agent.conftest import ROOT, Coordinator, _base_env
from tests.agent.refit_worker import GENERATOR, seed_of, the_plan
from tests.refit.worker import full_state, tensor_hash

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("refit_worker.py")
KEYS = ("step-1", "step-2")


class Side:
    def __init__(
        self,
        coordinator: Coordinator,
        group: str,
        size: int,
        out: Path,
        *args: str,
        replace: bool = False,
    ) -> None:
        self.events: queue.Queue[tuple[int, str, dict[str, Any]]] = queue.Queue()
        self.exits: queue.Queue[WorkerExit] = queue.Queue()
        self.launcher = Launcher(
            [sys.executable, str(WORKER), str(out), ",".join(KEYS), *args],
            coordinator=coordinator.url,
            group=group,
            ranks=range(size),
            stdout=subprocess.PIPE,
            replace_failed=replace,
            on_exit=self.exits.put,
            on_spawn=self._read,
            env={"PYTHONPATH": str(ROOT), **_base_env()},
        )

    def _read(self, worker: Any) -> None:
        def run() -> None:
            assert worker.process.stdout is not None
            for line in worker.process.stdout:
                with contextlib.suppress(ValueError):
                    self.events.put((worker.rank, worker.incarnation, json.loads(line)))

        threading.Thread(target=run, daemon=True).start()


def transfer_changes(db: Path) -> list[TransferChanged]:
    """Every transfer change, by folding the log from offset 1 with the real fold."""

    async def fold() -> list[TransferChanged]:
        log = await open_log(db, create=False)
        machine = Fold()
        out: list[TransferChanged] = []
        after = 0
        try:
            while page := await log.read(after, 5000):
                for rec in page:
                    out += [e for e in machine.step(rec) if isinstance(e, TransferChanged)]
                after = page[-1].offset
        finally:
            await log.close()
        return out

    return asyncio.run(fold())


def collect(sides: list[Side], want_done: int, timeout: float = 480.0) -> list[tuple]:
    """Every worker event until ``want_done`` workers said ``done``."""
    got: list[tuple] = []
    done = 0
    deadline = time.monotonic() + timeout
    while done < want_done:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {done} of {want_done} workers finished: {got[-20:]}")
        for s in sides:
            with contextlib.suppress(queue.Empty):
                item = s.events.get(timeout=0.05)
                got.append((s, *item))
                done += item[2]["event"] == "done"
    return got


def create_refit(coordinator: Coordinator) -> None:
    """Groups ``train`` (2) and ``gen`` (4) and refit ``rl`` between them."""
    # six torch processes start at once: formation and liveness bounds for a loaded machine
    patient = {"formation_timeout_s": 300.0, "heartbeat_timeout_s": 10.0}
    coordinator.create_group("train", 2, **patient)
    coordinator.create_group("gen", 4, **patient)
    coordinator.client.request(
        "POST",
        "/refits",
        json={
            "refit": "rl",
            "publisher": "train",
            "subscriber": "gen",
            "publisher_slots": 2,
            "subscriber_slots": 4,
            "lanes": 2,
            "readiness_timeout_s": 120,
        },
    )


def expected(key: str, slot: int) -> dict[str, str]:
    """The digests of generator ``slot``'s shards of the trainers' weights for ``key``."""
    from foldplane.agent.refit import local_shards

    full = full_state(seed_of(key))
    plan = the_plan()
    return {n: tensor_hash(t) for n, t in local_shards(full, plan, "subscriber", slot).items()}


def _run_by_kind(trainers: Side, generators: Side) -> dict[str, list[tuple]]:
    """Run both sides until six transfers are done; their events, by kind."""
    trainers.launcher.start()
    generators.launcher.start()
    try:
        events = collect([trainers, generators], want_done=6)
    finally:
        generators.launcher.stop()
        trainers.launcher.stop()
    by_kind: dict[str, list[tuple]] = {}
    for side, rank, inc, ev in events:
        by_kind.setdefault(ev["event"], []).append((side, rank, inc, ev))
    return by_kind


def test_tp2_trainers_refit_tp4_generators_then_a_generator_dies_and_the_retry_completes(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    create_refit(coordinator)
    trainers = Side(coordinator, "train", 2, tmp_path)
    generators = Side(coordinator, "gen", 4, tmp_path, "step-2", "3", replace=True)
    by_kind = _run_by_kind(trainers, generators)
    [(_, victim, victim_inc, dying)] = by_kind["dying"]
    assert dying["key"] == "step-2" and dying["attempt"] == 1

    # step-1: every generator holds exactly the trainers' weights, in one attempt
    # step-2: attempt 1 failed; a later attempt completed on every generator, the replacement too
    got = {}
    for side, rank, inc, ev in by_kind["transferred"]:
        if side is generators:
            got[(ev["key"], rank, inc)] = ev
    for rank in range(GENERATOR.size):
        first = [ev for (k, r, _), ev in got.items() if k == "step-1" and r == rank]
        assert first and first[0]["attempt"] == 1
        assert first[0]["hashes"] == expected("step-1", rank), f"generator {rank}, step-1"
        second = [ev for (k, r, _), ev in got.items() if k == "step-2" and r == rank]
        assert len(second) == 1, (rank, second)
        assert second[0]["attempt"] >= 2
        assert second[0]["hashes"] == expected("step-2", rank), f"generator {rank}, step-2"
    assert any(r == victim and i != victim_inc for (k, r, i) in got if k == "step-2")

    # the coordinator's account: attempt 1 of step-2 failed naming the dead generator
    status = coordinator.client.request("GET", "/refits/rl")
    transfers = {t["key"]: t for t in status["transfers"]}
    assert transfers["step-1"]["status"] == "completed" and transfers["step-1"]["attempt"] == 1
    assert transfers["step-2"]["status"] == "completed" and transfers["step-2"]["attempt"] >= 2
    failures = [t for t in transfer_changes(coordinator.db) if t.status == "failed"]
    assert failures and failures[0].key == "step-2" and failures[0].attempt == 1
    assert f"subscriber slot {victim} (gen rank {victim})" in failures[0].detail, failures[0]
    failed_attempt = [
        ev for side, rank, inc, ev in by_kind.get("attempt_failed", []) if ev["key"] == "step-2"
    ]
    assert failed_attempt, "the survivors saw attempt 1 fail"
    named = [ev["why"] for ev in failed_attempt]
    assert any(f"subscriber slot {victim}" in why for why in named), named


#: the refit world's store bound (``agent.refit.world.STORE_TIMEOUT_S``, which the worker's
#: ``timeout_s=30`` matches): what a member waited for before the coordinator's verdict
STORE_TIMEOUT_S = 30.0


def test_the_store_hosts_death_fails_the_attempt_at_once_naming_it_and_the_retry_completes(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    """Publisher slot 0 (trainer rank 0) SIGKILLs itself mid-transfer of ``step-2``, taking
    the world's store with it. Its launcher reports the death, the coordinator moves the
    refit's epoch, and every generator's transfer reads that verdict: the attempt fails well
    before the store's timeout, naming slot 0; the launcher's replacement of trainer 0 hosts a
    new store and the transfer completes on the next epoch."""
    create_refit(coordinator)
    trainers = Side(coordinator, "train", 2, tmp_path, "step-2", "0", "publisher", replace=True)
    generators = Side(coordinator, "gen", 4, tmp_path)
    by_kind = _run_by_kind(trainers, generators)
    [(side, victim, victim_inc, dying)] = by_kind["dying"]
    assert (side, victim, dying["key"], dying["attempt"]) == (trainers, 0, "step-2", 1)

    failed: dict[int, dict] = {}
    for side, rank, _, ev in by_kind.get("attempt_failed", []):
        if side is generators and (ev["key"], ev["attempt"]) == ("step-2", 1):
            failed.setdefault(rank, ev)  # each generator's first word of the failure
    assert sorted(failed) == [0, 1, 2, 3], by_kind.get("attempt_failed")
    for rank, ev in failed.items():
        assert "publisher slot 0 dead" in ev["why"], (rank, ev["why"])
        took = ev["at"] - dying["at"]
        assert took < STORE_TIMEOUT_S / 3, f"generator {rank} failed {took:.1f} s after: {ev}"

    got = {}
    for side, rank, inc, ev in by_kind["transferred"]:
        got[(side is generators, ev["key"], rank, inc)] = ev
    for rank in range(GENERATOR.size):
        second = [ev for (gen, k, r, _), ev in got.items() if gen and k == "step-2" and r == rank]
        assert len(second) == 1 and second[0]["attempt"] >= 2, (rank, second)
        assert second[0]["hashes"] == expected("step-2", rank), f"generator {rank}, step-2"
    replacement = [ev for (gen, k, r, i), ev in got.items() if not gen and k == "step-2" and r == 0]
    assert replacement and all(
        i != victim_inc for (gen, k, r, i) in got if not gen and k == "step-2" and r == 0
    )
    status = coordinator.client.request("GET", "/refits/rl")
    transfers = {t["key"]: t for t in status["transfers"]}
    assert transfers["step-2"]["status"] == "completed" and transfers["step-2"]["attempt"] >= 2
