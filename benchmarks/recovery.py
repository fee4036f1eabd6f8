"""Recovery: SIGKILL 1 of 4 workers -> the survivors' first successful all_reduce on a new group.

Three systems, measured in the same run on the same machine:

- **foldplane**: a coordinator on a SQLite file, 4 gloo workers started by the launcher and
  running all_reduce in a loop (5 ms of "compute" between steps). One worker is SIGKILLed; the
  launcher reports the death, the coordinator commits a view without it, the survivors build
  a group over the new view. Measured: from the kill to the moment every survivor has finished
  an all_reduce on the new view. Each sample is a fresh group of 4 on the same coordinator.
- **torchrun** (``--nnodes=1 --nproc-per-node=4 --max-restarts=1``, with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which restarts often fail:
  pytorch/pytorch#135712): rank 3 SIGKILLs itself; torchrun restarts every worker. Measured:
  from the kill to the moment every restarted worker has finished its first all_reduce.
- **torchft 0.2.0**: a lighthouse and 4 replica groups of 1 worker each, each step a quorum,
  an allreduce and a commit. One replica is SIGKILLed. Measured: from the kill to the moment
  every survivor has committed a step whose quorum has the 3 survivors.

Workers are this module, run as ``python benchmarks/recovery.py MODE``; they print one JSON
line per event on stdout with wall-clock times (``time.time()``), the same clock as the kill.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._cluster import free_port
from benchmarks._torchrun import restart_all
from benchmarks.harness import Result, lower_is_better_ratio, median, percentile

ROOT = Path(__file__).resolve().parents[1]
WORLD = 4
STEP_PAUSE_S = 0.005
TARGET = "<= 0.5 s"


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _log(text: str) -> None:
    print(f"# recovery: {text}", file=sys.stderr, flush=True)


class _Lines:
    """JSON lines from child processes' stdout, merged into one queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()

    def follow(self, process: subprocess.Popen[bytes]) -> None:
        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("{"):
                    try:
                        self.queue.put(json.loads(line))
                    except ValueError:
                        continue

        threading.Thread(target=read, daemon=True).start()

    def until(self, done: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> None:
        """Consume lines until ``done(line)`` returns True."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: nothing within {timeout:.0f} s")
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                continue
            if done(line):
                return


# -- foldplane -----------------------------------------------------------------------------------


def _foldplane(kills: int) -> tuple[list[float], list[str]]:
    """The recovery times, and the trials that did not recover in time (said, never dropped)."""
    from agent.client import CoordinatorClient

    tmp = tempfile.TemporaryDirectory(prefix="foldplane-bench-recovery-")
    port = free_port()
    server_log = open(f"{tmp.name}/coordinator.log", "wb")  # noqa: SIM115 (closed in finally)
    workers_log = open(f"{tmp.name}/workers.log", "wb")  # noqa: SIM115 (closed in finally)
    server = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "serve", "--db", f"{tmp.name}/log.db",
         "--port", str(port), "--store-port", "0", "--log-level", "warning"],
        cwd=ROOT,
        stdout=server_log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "FOLDPLANE_TOKEN": "", "FOLDPLANE_SECRET": ""},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    client = CoordinatorClient(url)
    try:
        _wait_healthy(client, server)
        samples: list[float] = []
        failed: list[str] = []
        for k in range(kills):
            victim = 1 + k % (WORLD - 1)
            try:
                samples.append(_foldplane_trial(url, client, f"bench{k}", victim, workers_log))
            except TimeoutError as exc:
                failed.append(f"trial {k + 1}: {exc}")
                tail = Path(tmp.name, "workers.log").read_bytes()[-2000:].decode(errors="replace")
                _log(
                    f"foldplane kill {k + 1}/{kills} FAILED: {exc}; workers.log ends with:\n{tail}"
                )
                continue
            _log(f"foldplane kill {k + 1}/{kills} (rank {victim}): {samples[-1]:.3f} s")
        if not samples:
            raise RuntimeError(f"no foldplane trial recovered: {failed}")
        return samples, failed
    except Exception:
        for name in ("coordinator.log", "workers.log"):
            tail = Path(tmp.name, name).read_bytes()[-3000:].decode(errors="replace")
            _log(f"{name} ends with:\n{tail}")
        raise
    finally:
        server.terminate()
        server.wait(30)
        server_log.close()
        workers_log.close()
        client.close()
        tmp.cleanup()


def _foldplane_trial(url: str, client: Any, group: str, victim: int, log: Any) -> float:
    """A fresh group of 4 workers; kill ``victim``; the time until every survivor recovered."""
    from agent.launch import Launcher

    client.create_group(group, WORLD, formation_timeout_s=300.0)
    launcher = Launcher(
        [sys.executable, __file__, "foldplane-worker"],
        coordinator=url,
        group=group,
        ranks=range(WORLD),
        stdout=subprocess.PIPE,
        stderr=log,
        env={**os.environ, "FOLDPLANE_TOKEN": ""},
    )
    lines = _Lines()
    launcher.on_spawn = lambda worker: lines.follow(worker.process)
    try:
        launcher.start()
        views = _Views(lines)
        views.reached(set(range(WORLD)), 1, 300, "formation")
        killed_at = time.time()
        launcher.kill(victim)
        first = views.first_after(set(range(WORLD)) - {victim}, 1, 60, f"kill of rank {victim}")
        return max(t for t, _ in first.values()) - killed_at
    finally:
        launcher.stop(grace_s=5)


def _wait_healthy(client: Any, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            client.healthz()
            return
        except Exception:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the coordinator did not start") from None
            time.sleep(0.1)


class _Views:
    """What each foldplane worker reported: its latest view with a successful all_reduce."""

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines
        self.latest: dict[int, int] = {}

    def reached(self, ranks: set[int], version: int, timeout: float, what: str) -> None:
        """Wait until every rank of ``ranks`` has succeeded on view ``version`` or later."""

        def done(line: dict[str, Any]) -> bool:
            self.latest[line["rank"]] = line["version"]
            return all(self.latest.get(r, 0) >= version for r in ranks)

        if not all(self.latest.get(r, 0) >= version for r in ranks):
            self.lines.until(done, timeout, what)

    def first_after(
        self, ranks: set[int], version: int, timeout: float, what: str
    ) -> dict[int, tuple[float, int]]:
        """Each rank's first success on a view newer than ``version``: (time, view)."""
        first: dict[int, tuple[float, int]] = {}

        def done(line: dict[str, Any]) -> bool:
            rank = line["rank"]
            self.latest[rank] = line["version"]
            if rank in ranks and line["version"] > version and rank not in first:
                first[rank] = (line["t"], line["version"])
            return set(first) == ranks

        self.lines.until(done, timeout, what)
        return first


def _foldplane_worker() -> int:
    """all_reduce in a loop; one line per first success on each view."""
    import logging

    import torch

    from agent import Agent

    logging.basicConfig(
        level=os.environ.get("RECOVERY_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(process)d %(name)s %(message)s",
    )
    agent = Agent(heartbeat_interval_s=0.5, collective_timeout_s=10.0, p2p_timeout_s=10.0).start()
    agent.wait_for_view(timeout=300)
    pg = agent.process_group()
    rank, reported = agent.rank, 0
    t = torch.ones(1024)
    pause = threading.Event()
    while True:
        t.fill_(1.0)
        # The view the op runs on is the one installed when it is issued: a newer view may be
        # installed while it runs, and waiting for "the view after the current one" would then
        # wait for a view that never comes.
        version, active = pg.version, rank in pg.active_ranks
        work = pg.all_reduce(t, async_op=True)
        ok = work.wait()
        if ok and version != reported and active:
            reported = version
            _emit(rank=rank, version=version, t=time.time())
        if not ok:
            agent.wait_for_view(version + 1, timeout=120)
        pause.wait(STEP_PAUSE_S)


# -- torchrun ------------------------------------------------------------------------------------


def _torchrun(trials: int) -> list[float]:
    return restart_all(__file__, "torchrun-worker", "RECOVERY_OUT", WORLD, trials, _log)


def _torchrun_worker() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = Path(os.environ["RECOVERY_OUT"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    t = torch.ones(1024)
    pause = threading.Event()
    step = 0
    while True:
        dist.all_reduce(t)
        step += 1
        if restart > 0:
            (out / f"restarted-{rank}").write_text(repr(time.time()))
            dist.destroy_process_group()
            return 0
        if rank == WORLD - 1 and step == 50:
            (out / "killed").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        pause.wait(STEP_PAUSE_S)


# -- torchft -------------------------------------------------------------------------------------


def _torchft(trials: int) -> list[float]:
    samples = []
    for k in range(trials):
        samples.append(_torchft_trial())
        _log(f"torchft trial {k + 1}/{trials}: {samples[-1]:.3f} s")
    return samples


def _torchft_trial() -> float:
    port = free_port()
    lighthouse_bin = Path(sys.executable).with_name("torchft_lighthouse")
    # Detection in 1 s (torchft's default heartbeat timeout is 5 s): a generous setting.
    lighthouse = subprocess.Popen(
        [str(lighthouse_bin), "--bind", f"127.0.0.1:{port}", "--min_replicas", "2",
         "--join_timeout_ms", "1000", "--quorum_tick_ms", "100", "--heartbeat_timeout_ms", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"http://127.0.0.1:{port}"
    lines = _Lines()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for r in range(WORLD):
            procs[r] = subprocess.Popen(
                [sys.executable, __file__, "torchft-worker", str(r), address],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            lines.follow(procs[r])
        waiting = set(range(WORLD))

        def all_four(line: dict[str, Any]) -> bool:
            if line.get("participants") == WORLD:
                waiting.discard(line["replica"])
            return not waiting

        lines.until(all_four, 600, "torchft formation")
        killed_at = time.time()
        procs[WORLD - 1].kill()
        first: dict[int, float] = {}

        def survivors_recovered(line: dict[str, Any]) -> bool:
            if line.get("participants") == WORLD - 1 and line["t"] > killed_at:
                first.setdefault(line["replica"], line["t"])
            return len(first) == WORLD - 1

        lines.until(survivors_recovered, 120, "torchft recovery")
        return max(first.values()) - killed_at
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        lighthouse.kill()
        lighthouse.wait()


def _torchft_worker(replica: int, lighthouse: str) -> int:
    from datetime import timedelta

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        load_state_dict=lambda _: None,
        state_dict=lambda: None,
        min_replica_size=2,
        use_async_quorum=False,
        replica_id=f"replica{replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    t = torch.ones(1024)
    pause = threading.Event()
    reported = 0
    while True:
        manager.start_quorum()
        t.fill_(1.0)
        manager.allreduce(t).wait()
        if manager.should_commit():
            participants = manager.num_participants()
            if participants != reported:
                reported = participants
                _emit(replica=replica, participants=participants, t=time.time())
        pause.wait(STEP_PAUSE_S)


# -- the benchmark -------------------------------------------------------------------------------


def run(quick: bool) -> list[Result]:
    kills, trials = (3, 1) if quick else (8, 3)
    ours, failed = _foldplane(kills)
    results: list[Result] = []
    extra = {"samples_s": [round(s, 4) for s in ours], "kills": kills, "failed_trials": failed}
    baselines: list[tuple[str, Callable[[int], list[float]]]] = [
        ("torchrun --max-restarts=1 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)", _torchrun),
        ("torchft 0.2.0 (lighthouse, 4 replica groups of 1)", _torchft),
    ]
    for name, measure in baselines:
        try:
            theirs = measure(trials)
        except Exception as exc:  # a baseline that cannot run here is said so, never faked
            _log(f"{name} could not be measured: {exc}")
            results.append(
                Result(
                    "recovery", "kill 1 of 4 -> first all_reduce on new group", "s",
                    median(ours), p99=percentile(ours, 99), baseline=name, target=TARGET,
                    extra={**extra, "baseline_error": str(exc)[:500]},
                )
            )  # fmt: skip
            continue
        results.append(
            Result(
                "recovery", "kill 1 of 4 -> first all_reduce on new group", "s",
                median(ours), p99=percentile(ours, 99), baseline=name,
                baseline_median=median(theirs), ratio=lower_is_better_ratio(median(ours), median(theirs)),
                target=TARGET, extra={**extra, "baseline_samples_s": [round(s, 3) for s in theirs]},
            )
        )  # fmt: skip
    return results


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "foldplane-worker":
        raise SystemExit(_foldplane_worker())
    if mode == "torchrun-worker":
        raise SystemExit(_torchrun_worker())
    if mode == "torchft-worker":
        raise SystemExit(_torchft_worker(int(sys.argv[2]), sys.argv[3]))
    raise SystemExit(f"unknown mode {mode!r}")
