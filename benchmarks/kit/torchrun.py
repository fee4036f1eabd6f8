"""One torchrun job on this machine: ``nodes`` torchrun agents of the same ``--rdzv-id``, each
``--nproc-per-node`` workers of ``examples/train_torchrun.py`` (a plain DDP script), on any
rendezvous backend (foldplane's, or torch's ``c10d``): the rendezvous benchmark and the
tests of ``torchrun --rdzv-backend foldplane`` run the same job the same way.

Every node runs ``python -m torch.distributed.run`` (torchrun) with ``--local-addr 127.0.0.1``
in a session of its own (so :meth:`TorchrunJob.close` ends its workers with it); the workers'
JSON lines (one per training step: ``rank``, ``world``, ``step``, ``restart``, ``pid``, ``t``)
come through torchrun's stdout into one :class:`~benchmarks.kit.workers.Lines`, and each
node's stderr goes to a file whose tail :meth:`TorchrunJob.tails` gives.

"Training again" after a kill is measured from just before the kill to the moment every rank
of the new round has finished a step in a process started after the kill (a pid not seen
before): the same clock, ``time.time()``, as the workers' lines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .service import ROOT
from .workers import Lines

#: The plain DDP script every node runs.
SCRIPT = ROOT / "examples" / "train_torchrun.py"


class TorchrunJob:
    """``nodes`` torchrun agents of one job (see the module docstring). A context manager."""

    def __init__(
        self,
        *,
        backend: str,
        endpoint: str,
        job: str,
        nodes: int = 2,
        nproc: int = 2,
        nnodes: str = "1:4",
        max_restarts: int = 3,
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        script_args: Sequence[str] = (),
        name: str = "torchrun",
    ) -> None:
        self.backend, self.endpoint, self.job = backend, endpoint, job
        self.nodes, self.nproc, self.nnodes, self.max_restarts = nodes, nproc, nnodes, max_restarts
        self.conf = dict(conf or {})
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self._dir = tempfile.TemporaryDirectory(prefix=f"foldplane-{name}-")
        self.dir = Path(self._dir.name)
        self.checkpoint = self.dir / "checkpoint.pt"
        self.script_args = ["--checkpoint", str(self.checkpoint), *script_args]
        self.lines = Lines()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def world(self) -> int:
        return self.nodes * self.nproc

    def command(self) -> list[str]:
        conf = ",".join(f"{k}={v}" for k, v in self.conf.items())
        return [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", self.nnodes,
            "--nproc-per-node", str(self.nproc), "--max-restarts", str(self.max_restarts),
            "--rdzv-backend", self.backend, "--rdzv-endpoint", self.endpoint,
            "--rdzv-id", self.job, *(["--rdzv-conf", conf] if conf else []),
            "--local-addr", "127.0.0.1", "--monitor-interval", "0.1",
            str(SCRIPT), *self.script_args,
        ]  # fmt: skip

    def start(self) -> TorchrunJob:
        for node in range(self.nodes):
            self.start_node(node)
        return self

    def start_node(self, node: int) -> subprocess.Popen[bytes]:
        with open(self.dir / f"node-{node}.log", "ab") as err:
            proc = subprocess.Popen(
                self.command(), cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=err,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        self.lines.follow(proc)
        return proc

    # -- what the workers printed -----------------------------------------------------------

    def trained(self, steps: int = 1, timeout: float = 300) -> None:
        """Wait until every rank of a full world has finished ``steps`` steps."""
        done: set[int] = set()

        def enough(line: dict[str, Any]) -> bool:
            if line.get("world") == self.world and line.get("step", 0) >= steps:
                done.add(line["rank"])
            return len(done) == self.world

        self.lines.until(enough, timeout, f"{self.world} workers training")

    def latest(self, rank: int) -> dict[str, Any]:
        """The latest line of ``rank`` printed so far."""
        self.lines.drain()
        return next(x for x in reversed(self.lines.seen) if x.get("rank") == rank)

    def kill_worker(self, rank: int) -> float:
        """SIGKILL the process of ``rank`` (its latest line's pid); the time just before."""
        pid = int(self.latest(rank)["pid"])
        killed_at = time.time()  # every line read before it was printed before the kill
        os.kill(pid, signal.SIGKILL)
        return killed_at

    def trained_again(self, killed_at: float, timeout: float) -> float:
        """Seconds from ``killed_at`` until every rank of a full world finished a step in a
        process started after the kill; TimeoutError (a hang, or a failed restart) past
        ``timeout``."""
        before = {x["pid"] for x in self.lines.seen}
        first: dict[int, float] = {}

        def again(line: dict[str, Any]) -> bool:
            new = line.get("pid") not in before and line.get("t", 0) > killed_at
            if new and line.get("world") == self.world:
                first.setdefault(line["rank"], line["t"])
            return len(first) == self.world

        self.lines.until(again, timeout, f"training again after the kill ({self.backend})")
        return max(first.values()) - killed_at

    def wait(self, timeout: float) -> list[int]:
        """Every node's exit code (TimeoutError past ``timeout``)."""
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        return codes

    def tails(self, size: int = 2500) -> str:
        return "\n".join(
            f"torchrun node {n} ({self.backend}) log ends with:\n"
            + (self.dir / f"node-{n}.log").read_bytes()[-size:].decode(errors="replace")
            for n in range(len(self.procs))
        )

    def close(self) -> None:
        """SIGTERM every node's session (torchrun stops its workers), SIGKILL what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> TorchrunJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
