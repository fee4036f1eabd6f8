"""Fixtures of the HSDP suite: a real coordinator and replicas of real worker processes.

A replica is ``shards`` processes, one per shard index, each started by a launcher of its own
(the launcher of group ``<job>-s<shard>``, rank = the replica's index), all with the replica's
``FOLDPLANE_REPLICA_ID``; a replacement replica gets a new one.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from foldplane.agent.fsdp import REPLICA_ID_ENV, SHARD_ENV, SHARDS_ENV
from foldplane.agent.launch import Launcher, WorkerExit
from tests.agent.conftest import ROOT, Coordinator, _base_env, _read_events
from tests.agent.conftest import coordinator as coordinator  # noqa: PLC0414 (the fixture)

WORKER = Path(__file__).with_name("fsdp_worker.py")

Key = tuple[int, int]  # (replica, shard)


@dataclass
class HSDPJob:
    """``replicas`` × ``shards`` worker processes, driven over stdin/stdout."""

    coordinator: Coordinator
    name: str
    replicas: int
    shards: int
    collective_timeout_s: float = 5.0
    launchers: dict[Key, Launcher] = field(default_factory=dict)
    events: dict[Key, queue.Queue[dict[str, Any]]] = field(default_factory=dict)
    exits: queue.Queue[WorkerExit] = field(default_factory=queue.Queue)

    def group(self, shard: int) -> str:
        return f"{self.name}-s{shard}"

    def keys(self, replicas: list[int] | None = None) -> list[Key]:
        rs = range(self.replicas) if replicas is None else replicas
        return [(r, s) for r in rs for s in range(self.shards)]

    def start_replica(self, replica: int) -> list[int]:
        """Start (or replace) ``replica``'s processes; their pids."""
        replica_id = uuid.uuid4().hex
        pids = []
        for shard in range(self.shards):
            env = {
                "PYTHONPATH": str(ROOT),
                **_base_env(),
                REPLICA_ID_ENV: replica_id,
                SHARD_ENV: str(shard),
                SHARDS_ENV: str(self.shards),
            }
            launcher = Launcher(
                [sys.executable, str(WORKER), str(self.collective_timeout_s)],
                coordinator=self.coordinator.url,
                group=self.group(shard),
                ranks=[replica],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                on_exit=self.exits.put,
                env=env,
                relay=False,
            )
            old = self.launchers.get((replica, shard))
            if old is not None:
                old.stop(grace_s=1)
            self.launchers[(replica, shard)] = launcher
            worker = launcher.spawn(replica)
            q: queue.Queue[dict[str, Any]] = queue.Queue()
            self.events[(replica, shard)] = q
            threading.Thread(target=_read_events, args=(worker.process, q), daemon=True).start()
            pids.append(worker.process.pid)
        return pids

    def kill_replica(self, replica: int) -> None:
        for shard in range(self.shards):
            self.launchers[(replica, shard)].kill(replica)

    def pid(self, key: Key) -> int:
        return self.launchers[key].worker(key[0]).process.pid

    def send(self, targets: list[Key], cmd: str, **args: Any) -> None:
        for key in targets:
            stdin = self.launchers[key].worker(key[0]).process.stdin
            assert stdin is not None
            stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
            stdin.flush()

    def expect(self, key: Key, event: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next event ``event`` from ``key`` (an ``error`` event fails the test)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{key}: no {event!r} event within {timeout} s")
            try:
                got = self.events[key].get(timeout=left)
            except queue.Empty:
                continue
            if got["event"] == "error":
                raise AssertionError(f"{key}: {got['cmd']} failed: {got['error']}\n{got['tb']}")
            if got["event"] == "exited":
                raise AssertionError(f"{key} exited while waiting for {event!r}")
            if got["event"] == event:
                return got

    def stop(self) -> None:
        for key in list(self.launchers):
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.send([key], "close")
        for launcher in self.launchers.values():
            with contextlib.suppress(TimeoutError):
                launcher.wait(timeout=15)
            launcher.stop(grace_s=5)


@pytest.fixture
def hsdp(coordinator: Coordinator) -> Iterator[Any]:
    """A factory: ``hsdp("job", 2, 2)`` creates the job's groups and starts every replica
    (``collective_timeout_s``: its processes' collective timeout, 5 s by default)."""
    made: list[HSDPJob] = []

    def make(
        name: str, replicas: int, shards: int, collective_timeout_s: float = 5.0, **config: Any
    ) -> HSDPJob:
        job = HSDPJob(coordinator, name, replicas, shards, collective_timeout_s)
        for shard in range(shards):
            coordinator.create_group(job.group(shard), replicas, **config)
        made.append(job)
        for replica in range(replicas):
            job.start_replica(replica)
        return job

    yield make
    for job in made:
        job.stop()
