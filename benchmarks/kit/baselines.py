"""The peers the recovery benchmarks measure in the same run, each driven one way.

- **torchrun** (:func:`restart_all`, :func:`restart_all_worker`): ``python -m
  torch.distributed.run --max-restarts=1`` over ``world`` copies of a worker; the last rank
  SIGKILLs itself at a chosen step and torchrun restarts every worker. With
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which restarts often fail
  (pytorch/pytorch#135712).
- **torchft 0.2.0** (:class:`Lighthouse`, :class:`ReplicaGroups`, :func:`torchft_manager`):
  a lighthouse and replica groups of one process each, the last one SIGKILLed; the lighthouse
  detects in 1 s (its default heartbeat timeout is 5 s: a generous setting).

A peer that cannot run here is said so, never faked (:func:`measured`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .kills import time_recovery
from .service import ROOT, free_port
from .workers import Lines


def measured(what: str, fn: Callable[[], Any], log: Callable[[str], None]) -> Any:
    """``fn()``, or the exception that kept it from running (logged: said, never faked)."""
    try:
        return fn()
    except Exception as exc:
        log(f"{what} could not be measured: {exc}")
        return exc


# -- torchrun ----------------------------------------------------------------------------------


def restart_all(
    module: str,
    mode: str,
    out_env: str,
    world: int,
    trials: int,
    log: Callable[[str], None],
) -> list[float]:
    """Per trial, run torchrun over ``world`` copies of ``python -m module mode``; the seconds from the
    moment the victim wrote ``killed`` into the directory named by ``$out_env`` to the last
    restarted worker's ``restarted-<rank>`` file (:func:`restart_all_worker` writes both)."""
    samples = []
    for k in range(trials):
        with tempfile.TemporaryDirectory(prefix="foldplane-bench-torchrun-") as out:
            env = {
                **os.environ,
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                out_env: out,
                "OMP_NUM_THREADS": "1",
            }
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
                f"--nproc-per-node={world}", "--max-restarts=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", module, mode,
            ]  # fmt: skip
            proc = subprocess.run(
                cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                timeout=600,
            )  # fmt: skip
            files = {p.name: float(p.read_text()) for p in Path(out).iterdir()}
            restarted = [v for name, v in files.items() if name.startswith("restarted-")]
            if proc.returncode != 0 or "killed" not in files or len(restarted) != world:
                tail = proc.stderr.decode(errors="replace")[-2000:]
                raise RuntimeError(f"torchrun trial {k + 1} failed ({proc.returncode}): {tail}")
            samples.append(max(restarted) - files["killed"])
            log(f"torchrun trial {k + 1}/{trials}: {samples[-1]:.3f} s")
    return samples


def restart_all_worker(
    out_env: str,
    world: int,
    kill_step: int,
    setup: Callable[[int], Callable[[int], object]],
    backend: str = "gloo",
) -> int:
    """A torchrun worker of :func:`restart_all`: on the default ``backend`` group (made here),
    ``setup(rank)`` gives the step, run as ``step(n)`` for n = 1, 2, ...; the last rank
    SIGKILLs itself after step ``kill_step``; a restarted worker notes the time after its first
    step and exits."""
    import torch.distributed as dist

    dist.init_process_group(backend)
    rank = dist.get_rank()
    out = Path(os.environ[out_env])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    step = setup(rank)
    n = 0
    while True:
        n += 1
        step(n)
        if restart > 0:
            (out / f"restarted-{rank}").write_text(repr(time.time()))
            dist.destroy_process_group()
            return 0
        if rank == world - 1 and n == kill_step:
            (out / "killed").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


# -- torchft -----------------------------------------------------------------------------------


class Lighthouse:
    """torchft's lighthouse process on a free loopback port, detecting a death in 1 s."""

    def __init__(self, min_replicas: int = 2) -> None:
        port = free_port()
        self.address = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("torchft_lighthouse")),
             "--bind", f"127.0.0.1:{port}", "--min_replicas", str(min_replicas),
             "--join_timeout_ms", "1000", "--quorum_tick_ms", "100",
             "--heartbeat_timeout_ms", "1000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


class ReplicaGroups:
    """``world`` torchft replica groups of one process each under a :class:`Lighthouse`.

    Replica ``r`` runs ``command(r, lighthouse_address)``; it prints a line with ``replica``,
    ``participants`` and ``t`` at least whenever a step it committed had a new number of
    participants. Its stderr goes to a file, whose tail :meth:`tails` gives. A context manager.
    """

    def __init__(self, command: Callable[[int, str], list[str]], world: int) -> None:
        self.command, self.world = command, world
        self.lighthouse = Lighthouse()
        self.lines = Lines()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._logs = tempfile.TemporaryDirectory(prefix="foldplane-bench-torchft-")
        for r in range(world):
            self.start(r)

    def start(self, replica: int) -> None:
        with open(f"{self._logs.name}/replica{replica}.log", "ab") as err:
            self.procs[replica] = subprocess.Popen(
                self.command(replica, self.lighthouse.address),
                cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )  # fmt: skip
        self.lines.follow(self.procs[replica])

    def formed(self, commits: int = 1, timeout: float = 600) -> None:
        """Wait until every replica committed ``commits`` steps with all ``world`` taking part."""
        seen: dict[int, int] = {}

        def done(line: dict[str, Any]) -> bool:
            if line.get("participants") == self.world:
                seen[line["replica"]] = seen.get(line["replica"], 0) + 1
            return len(seen) == self.world and min(seen.values()) >= commits

        self.lines.until(done, timeout, "torchft formation")

    def kill_last(self, timeout: float = 300) -> float:
        """SIGKILL the last replica; seconds until every survivor committed a step whose
        quorum is the survivors."""
        victim = self.procs[self.world - 1]

        def kill() -> None:
            victim.kill()
            victim.wait()

        def recovered(line: dict[str, Any], killed_at: float) -> int | None:
            ok = line.get("participants") == self.world - 1 and line["t"] > killed_at
            return line["replica"] if ok else None

        survivors = set(range(self.world - 1))
        return time_recovery(
            self.lines, kill, survivors, recovered, timeout, "torchft recovery"
        ).seconds

    def tails(self) -> str:
        return "\n".join(
            f"torchft replica {r} log ends with:\n"
            + Path(self._logs.name, f"replica{r}.log").read_bytes()[-1500:].decode(errors="replace")
            for r in range(self.world)
        )

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.lighthouse.close()
        self._logs.cleanup()

    def __enter__(self) -> ReplicaGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Each replica's store lives as long as its process (the manager reaches it by port).
_stores: list[Any] = []


def torchft_manager(
    replica: int,
    lighthouse: str,
    *,
    timeout_s: float,
    quorum_timeout_s: float,
    state_dict: Callable[[], Any] = lambda: None,
    load_state_dict: Callable[[Any], None] = lambda _: None,
    backend: str = "gloo",
) -> Any:
    """The worker side: replica ``replica``'s ``torchft.Manager`` (a replica group of one
    process on ``backend``, gloo or nccl; synchronous quorum, at least 2 replicas)."""
    from datetime import timedelta

    import torchft
    from torch.distributed import TCPStore

    groups = {"gloo": torchft.ProcessGroupGloo, "nccl": torchft.ProcessGroupNCCL}
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _stores.append(store)
    return torchft.Manager(
        pg=groups[backend](timeout=timedelta(seconds=timeout_s)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=2,
        use_async_quorum=False,
        replica_id=f"replica{replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        timeout=timedelta(seconds=timeout_s),
        quorum_timeout=timedelta(seconds=quorum_timeout_s),
    )
