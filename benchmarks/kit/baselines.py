"""The peers the recovery benchmarks measure in the same run, each driven one way.

- **torchrun** (:func:`restart_all`, :func:`restart_all_worker`): ``python -m
  torch.distributed.run --max-restarts=1`` over ``world`` copies of a worker; the last rank
  SIGKILLs itself at a chosen step and torchrun restarts every worker. With
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which restarts often fail
  (pytorch/pytorch#135712).
- **torchft** (torchft-nightly, the ``bench`` extra; :class:`Lighthouse`,
  :class:`ReplicaGroups`, :func:`torchft_manager`, :func:`quorum_rounds`): a lighthouse and
  replica groups of one process each, the last one SIGKILLed; the lighthouse detects in 1 s
  (its default heartbeat timeout is 5 s: a generous setting). The same replica groups run on a
  foldplane coordinator as their lighthouse (:class:`FoldplaneLighthouse`), with the same
  settings, whose launcher reports the death it saw.

A peer that cannot run here is said so, never faked (:func:`measured`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from .kills import time_recovery
from .service import ROOT, free_port
from .workers import Lines


def torchft_version() -> str:
    """The installed torchft's name and version (``torchft-nightly 2026.10.26``), as the rows
    that measure it name it; ``torchft (not installed)`` without it."""
    from importlib import metadata

    for dist in ("torchft-nightly", "torchft"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "torchft (not installed)"


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


#: The quorum rule's settings both lighthouses run with (torchft's names): a death is seen in
#: 1 s (torchft's default heartbeat timeout is 5 s: a generous setting for torchft).
LIGHTHOUSE_SETTINGS = {"join_timeout_ms": 1000, "quorum_tick_ms": 100, "heartbeat_timeout_ms": 1000}


class Lighthouse:
    """torchft's lighthouse process (``torchft_lighthouse``) on a free loopback port."""

    name = "torchft lighthouse"

    def __init__(self, min_replicas: int = 2, **settings: int) -> None:
        port = free_port()
        self.address = f"http://127.0.0.1:{port}"
        options = [f"--{k}={v}" for k, v in {**LIGHTHOUSE_SETTINGS, **settings}.items()]
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("torchft_lighthouse")),
             "--bind", f"127.0.0.1:{port}", "--min_replicas", str(min_replicas), *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_listening(port, self.process)

    def lost(self, replica: str, reason: str) -> None:
        """torchft's lighthouse has no way to hear of a death: it waits for the heartbeats."""

    def close(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FoldplaneLighthouse:
    """A foldplane coordinator as torchft's lighthouse (``serve --lighthouse-port``, a SQLite
    log) with the same settings; :meth:`lost` is its launcher's death report."""

    name = "foldplane lighthouse"

    def __init__(self, min_replicas: int = 2, **settings: int) -> None:
        from .service import Service

        port = free_port()
        self.address = f"http://127.0.0.1:{port}"
        options = ["--lighthouse-port", str(port), "--lighthouse-min-replicas", str(min_replicas)]
        for k, v in {**LIGHTHOUSE_SETTINGS, **settings}.items():
            options += [f"--lighthouse-{k.replace('_', '-')}", str(v)]
        self.service = Service(*options, name="lighthouse").start()
        _wait_listening(port, self.service.process)
        # the launcher's client, connected before anything dies (as a launcher holds one)
        self._client = httpx.Client(base_url=self.service.url, timeout=10)
        self._client.get("/healthz").raise_for_status()

    def lost(self, replica: str, reason: str) -> None:
        """What a launcher that saw ``replica`` die tells the coordinator."""
        answer = self._client.post(f"/lighthouse/replicas/{replica}/lost", json={"reason": reason})
        answer.raise_for_status()

    def close(self) -> None:
        self._client.close()
        self.service.close()

    def __enter__(self) -> FoldplaneLighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_listening(port: int, process: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on 127.0.0.1:{port} (exit {process.poll()})")
        time.sleep(0.02)


def quorum_rounds(address: str, replicas: int, rounds: int, warmup: int = 2) -> list[float]:
    """Milliseconds of ``rounds`` quorums of ``replicas`` members on the lighthouse at
    ``address``: each member a thread calling torchft's ``LighthouseClient.quorum`` at once, a
    round timed from the release of the threads to the last answer (the first ``warmup``
    rounds, which form the quorum, left out)."""
    from torchft._torchft import LighthouseClient

    clients = [
        LighthouseClient(addr=address, connect_timeout=timedelta(seconds=5))
        for _ in range(replicas)
    ]
    times: list[float] = []
    for step in range(rounds + warmup):
        barrier = threading.Barrier(replicas + 1)
        done: list[float] = []

        def join(i: int, step: int = step, barrier: threading.Barrier = barrier,
                 done: list[float] = done) -> None:  # fmt: skip
            barrier.wait()
            clients[i].quorum(
                replica_id=f"replica-{i}", timeout=timedelta(seconds=30), step=step, world_size=1
            )
            done.append(time.perf_counter())

        threads = [threading.Thread(target=join, args=(i,)) for i in range(replicas)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        if len(done) != replicas:
            raise RuntimeError(f"round {step}: {len(done)} of {replicas} quorum calls answered")
        if step >= warmup:
            times.append((max(done) - t0) * 1000)
    return times


class ReplicaGroups:
    """``world`` torchft replica groups of one process each under a :class:`Lighthouse`.

    Replica ``r`` runs ``command(r, lighthouse_address)``; it prints a line with ``replica``,
    ``participants`` and ``t`` at least whenever a step it committed had a new number of
    participants. Its stderr goes to a file, whose tail :meth:`tails` gives. ``lighthouse``
    makes the lighthouse (:class:`Lighthouse`, :class:`FoldplaneLighthouse`). A context manager.
    """

    def __init__(
        self,
        command: Callable[[int, str], list[str]],
        world: int,
        lighthouse: Callable[[], Any] = Lighthouse,
    ) -> None:
        self.command, self.world = command, world
        self.lighthouse = lighthouse()
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
        """SIGKILL the last replica, and tell the lighthouse as a launcher that saw the death
        would (torchft's cannot hear it); seconds until every survivor committed a step whose
        quorum is the survivors."""
        victim = self.procs[self.world - 1]

        def kill() -> None:
            victim.kill()
            victim.wait()
            self.lighthouse.lost(f"replica{self.world - 1}", f"exit {victim.returncode}")

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
    min_replica_size: int = 2,
    native: tuple[str, int, int] | None = None,
) -> Any:
    """The worker side: replica ``replica``'s ``torchft.Manager`` (a replica group of one
    process on ``backend``, gloo or nccl; synchronous quorum, at least ``min_replica_size``
    replicas). ``native=(store_host, store_port, replicas)``: torch's own gloo group with
    ``enable_reconfigure`` (torch >= 2.14), rendezvousing on the job's store at that address,
    instead of torchft's process group."""
    import torchft
    from torch.distributed import TCPStore

    groups = {"gloo": torchft.ProcessGroupGloo, "nccl": torchft.ProcessGroupNCCL}
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    _stores.append(store)
    pg = (
        groups[backend](timeout=timedelta(seconds=timeout_s))
        if native is None
        else _native_gloo(replica, *native)
    )
    return torchft.Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=min_replica_size,
        use_async_quorum=False,
        replica_id=f"replica{replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=timeout_s),
        quorum_timeout=timedelta(seconds=quorum_timeout_s),
    )


def _native_gloo(replica: int, host: str, port: int, replicas: int) -> Any:
    """torch's gloo group with ``enable_reconfigure`` on the job's store (which outlives the
    replica groups: each reconfigure rendezvouses on it under the quorum's id)."""
    import torch
    import torch.distributed as dist

    job = dist.TCPStore(host, port, is_master=False, wait_for_workers=False)
    _stores.append(job)
    native = dist.PrefixStore("native/0", job)
    pg = dist.ProcessGroup(native, replica, replicas)
    backend = dist.ProcessGroupGloo(native, replica, replicas, enable_reconfigure=True)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return pg
