"""The test process as the coordinator: it hosts the store, spawns workers and commits views."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import uuid
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore

from tests.dataplane import worker

#: Small enough that a test never waits long, large enough for a loaded 2-core machine.
TEST_OPTIONS: dict[str, Any] = {
    "collective_timeout_s": 5.0,
    "p2p_timeout_s": 5.0,
    "liveness_period_s": 0.1,
    "liveness_window_periods": 5,
}
REPLY_TIMEOUT_S = 60.0


class WorkerFailed(AssertionError):
    pass


class Cluster:
    """Workers ``0..world_size-1``, each a real process with its own DataPlane."""

    def __init__(
        self,
        world_size: int,
        options: dict[str, Any] | None = None,
        target: Any = worker.main,
    ) -> None:
        """``target(conn, rank, world_size, port, incarnation, options)`` is each worker's main
        (``tests/gpu/worker.py`` has the GPU one)."""
        self.world_size = world_size
        self.target = target
        self.options = {**TEST_OPTIONS, **(options or {})}
        self.store = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.version = 0
        #: how long a worker may take to answer a command
        self.reply_timeout_s = REPLY_TIMEOUT_S
        self._ctx = mp.get_context("spawn")
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}
        self.info: dict[int, dict[str, Any]] = {}

    def spawn(self, *ranks: int) -> None:
        """Start a fresh process (a new incarnation) for each rank."""
        for rank in ranks:
            parent, child = self._ctx.Pipe()
            inc = uuid.uuid4().hex
            proc = self._ctx.Process(
                target=self.target,
                args=(child, rank, self.world_size, self.store.port, inc, self.options),
                daemon=True,
            )
            proc.start()
            child.close()
            self.procs[rank], self.conns[rank] = proc, parent
        for rank in ranks:
            self.info[rank] = self._reply(rank)

    def kill(self, rank: int) -> None:
        """SIGKILL the rank's process and reap it."""
        proc = self.procs.pop(rank)
        self.conns.pop(rank).close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)

    def alive(self) -> list[int]:
        return sorted(self.procs)

    def commit(self, active_ranks: list[int]) -> int:
        """Commit the next view to every live worker (active or not), as the coordinator would."""
        self.version += 1
        self.call_all({r: ("install", (self.version, active_ranks)) for r in self.alive()})
        return self.version

    def op(self, ranks: list[int], name: str, **kwargs: Any) -> dict[int, dict[str, Any]]:
        """Run one operation on ``ranks`` concurrently; per-rank kwargs may be given as dicts."""
        cmds = {}
        for r in ranks:
            kw = {k: (v[r] if isinstance(v, dict) else v) for k, v in kwargs.items()}
            cmds[r] = ("op", (name, kw))
        return self.call_all(cmds)

    def start(self, cmds: dict[int, tuple[str, tuple]]) -> None:
        """Send commands without waiting for the answers (see ``collect``)."""
        for rank, cmd in cmds.items():
            self.conns[rank].send(cmd)

    def collect(self, ranks: list[int]) -> dict[int, Any]:
        return {rank: self._reply(rank) for rank in ranks}

    def call_all(self, cmds: dict[int, tuple[str, tuple]]) -> dict[int, Any]:
        self.start(cmds)
        return self.collect(list(cmds))

    def ensure_full_view(self) -> int:
        """Respawn whatever rank is missing and commit a view with every rank active."""
        missing = [r for r in range(self.world_size) if r not in self.procs]
        if missing:
            self.spawn(*missing)
        return self.commit(list(range(self.world_size)))

    def call(self, rank: int, cmd: str, *args: Any) -> Any:
        return self.call_all({rank: (cmd, args)})[rank]

    def _reply(self, rank: int) -> Any:
        conn = self.conns[rank]
        if not conn.poll(self.reply_timeout_s):
            raise WorkerFailed(f"rank {rank} did not answer within {self.reply_timeout_s} s")
        try:
            answer = conn.recv()
        except EOFError:
            raise WorkerFailed(
                f"rank {rank}'s process exited (exit code {self.procs[rank].exitcode})"
            ) from None
        if isinstance(answer, dict) and "raised" in answer:
            raise WorkerFailed(
                f"rank {rank} raised {answer['raised']}: {answer['message']}\n{answer['trace']}"
            )
        return answer

    def close(self) -> None:
        for rank in list(self.procs):
            try:
                self.conns[rank].send(("close", ()))
                self.conns[rank].poll(10)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs.values():
            proc.join(10)
            if proc.is_alive():
                proc.kill()
