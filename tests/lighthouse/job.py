"""A torchft job on a foldplane lighthouse, driven as its launcher would drive it: replica groups
as processes (``tests/lighthouse/replica.py``), the job's store they rendezvous on, and what a
launcher does when it sees a replica group die: tell the coordinator
(``POST /lighthouse/replicas/{replica}/lost``), then start the replacement."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.service.conftest import ROOT


class Replicas:
    """Replica groups ``train0``, ``train1``, ... of one process each, every line they print
    kept (``lines``), each process's stderr in ``directory``."""

    def __init__(self, lighthouse: str, store: str, directory: Path, **options: Any) -> None:
        self.lighthouse, self.store, self.directory = lighthouse, store, directory
        self.options = options
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.lines: list[dict[str, Any]] = []
        self._new: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self.started: dict[int, list[int]] = {}

    def start(self, replica: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.lighthouse.replica", str(replica), self.store]
        for name, value in self.options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        env = {**os.environ, "TORCHFT_LIGHTHOUSE": self.lighthouse, "OMP_NUM_THREADS": "1"}
        with open(self.directory / f"replica{replica}.log", "ab") as err:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err
            )  # fmt: skip
        self.procs[replica] = proc
        self.started.setdefault(replica, []).append(proc.pid)
        threading.Thread(target=self._follow, args=(proc,), daemon=True).start()
        return proc

    def _follow(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                self.lines.append(line)
            self._new.put(line)

    def until(self, done: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict:
        """The first line from now on (or already seen) for which ``done`` holds."""
        with self._lock:
            for line in self.lines:
                if done(line):
                    return line
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}\n{self.tails()}"
                )
            try:
                line = self._new.get(timeout=min(left, 1.0))
            except queue.Empty:
                for r, p in self.procs.items():
                    if p.poll() is not None and p.returncode != -signal.SIGKILL:
                        raise AssertionError(
                            f"replica {r} exited with {p.returncode} while waiting for {what}\n"
                            + self.tails()
                        ) from None
                continue
            if done(line):
                return line

    def of(self, replica: int, pid: int | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                ln for ln in self.lines
                if ln["replica"] == replica and (pid is None or ln["pid"] == pid)
            ]  # fmt: skip

    def kill(self, replica: int) -> float:
        """SIGKILL the replica group's process and wait for it: the time of the kill."""
        proc = self.procs[replica]
        at = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return at

    def tails(self) -> str:
        out = []
        for r in sorted(self.procs):
            path = self.directory / f"replica{r}.log"
            text = path.read_bytes()[-2500:].decode(errors="replace") if path.exists() else ""
            out.append(f"-- replica {r} (exit {self.procs[r].poll()}):\n{text}")
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def report_lost(coordinator: str, replica: str, reason: str, token: str | None = None) -> int:
    """What the launcher tells the coordinator when it sees ``replica`` die: the offset."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    answer = httpx.post(
        f"{coordinator}/lighthouse/replicas/{replica}/lost",
        json={"reason": reason},
        headers=headers,
        timeout=10,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["offset"]
