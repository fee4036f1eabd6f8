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
- **torchft** (the ``bench`` extra: torchft-nightly; the row names the version it ran): a
  lighthouse and 4 replica groups of 1 worker each, each step a quorum,
  an allreduce and a commit. One replica is SIGKILLed. Measured: from the kill to the moment
  every survivor has committed a step whose quorum has the 3 survivors.

Workers are this module, run as ``python benchmarks/recovery.py MODE``; they print one JSON
line per event on stdout with wall-clock times (``time.time()``), the same clock as the kill.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile
from .kit import baselines
from .kit.kills import time_recovery
from .kit.service import Service
from .kit.workers import Lines, all_reduce_loop, emit, say, start_agent

WORLD = 4
STEP_PAUSE_S = 0.005
TARGET = "<= 0.5 s"
METRIC = "kill 1 of 4 -> first all_reduce on new group"

_log = say("recovery")


# -- foldplane -----------------------------------------------------------------------------------


def _foldplane(kills: int) -> tuple[list[float], list[str]]:
    """The recovery times, and the trials that did not recover in time (said, never dropped)."""
    with Service(store=True, name="recovery").start() as service:
        try:
            samples: list[float] = []
            failed: list[str] = []
            for k in range(kills):
                victim = 1 + k % (WORLD - 1)
                try:
                    samples.append(_foldplane_trial(service, victim))
                except TimeoutError as exc:
                    failed.append(f"trial {k + 1}: {exc}")
                    _log(f"foldplane kill {k + 1}/{kills} FAILED: {exc}; "
                         f"{service.tail('workers.log', 2000)}")  # fmt: skip
                    continue
                _log(f"foldplane kill {k + 1}/{kills} (rank {victim}): {samples[-1]:.3f} s")
            if not samples:
                raise RuntimeError(f"no foldplane trial recovered: {failed}")
            return samples, failed
        except Exception:
            _log(service.tails())
            raise


def _foldplane_trial(service: Service, victim: int) -> float:
    """A fresh group of 4 workers; kill ``victim``; the time until every survivor recovered."""
    group = service.new_group("bench", WORLD)
    lines = Lines()
    launcher = service.launch(
        [sys.executable, "-m", __name__, "foldplane-worker"], group, range(WORLD), lines.follow
    )
    try:
        everyone = set(range(WORLD))
        lines.wait_for(lambda: everyone <= {s["rank"] for s in lines.seen}, 300, "formation")

        def on_new_view(line: dict[str, Any], _: float) -> int | None:
            return line["rank"] if line["version"] > 1 else None

        return time_recovery(
            lines, lambda: launcher.kill(victim), everyone - {victim}, on_new_view, 60,
            f"kill of rank {victim}",
        ).seconds  # fmt: skip
    finally:
        launcher.stop(grace_s=5)


def _foldplane_worker() -> int:
    """all_reduce in a loop; one line per first success on each view."""
    agent = start_agent(timeout_s=10.0)
    all_reduce_loop(
        agent, lambda version: emit(rank=agent.rank, version=version, t=time.time()), STEP_PAUSE_S
    )
    return 0


# -- torchrun ------------------------------------------------------------------------------------


def _torchrun(trials: int) -> list[float]:
    return baselines.restart_all(__name__, "torchrun-worker", "RECOVERY_OUT", WORLD, trials, _log)


def _torchrun_step(rank: int) -> Any:
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    pause = threading.Event()

    def step(n: int) -> None:
        if n > 1:
            pause.wait(STEP_PAUSE_S)
        dist.all_reduce(t)

    return step


# -- torchft -------------------------------------------------------------------------------------


def _torchft(trials: int) -> list[float]:
    samples = []
    for k in range(trials):
        with baselines.ReplicaGroups(
            lambda r, address: [sys.executable, "-m", __name__, "torchft-worker", str(r), address],
            WORLD,
        ) as replicas:
            replicas.formed()
            samples.append(replicas.kill_last(120))
        _log(f"torchft trial {k + 1}/{trials}: {samples[-1]:.3f} s")
    return samples


def _torchft_worker(replica: int, lighthouse: str) -> int:
    import torch

    manager = baselines.torchft_manager(replica, lighthouse, timeout_s=10, quorum_timeout_s=60)
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
                emit(replica=replica, participants=participants, t=time.time())
        pause.wait(STEP_PAUSE_S)


# -- the benchmark -------------------------------------------------------------------------------

BASELINES = {
    "torchrun --max-restarts=1 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)": _torchrun,
    f"{baselines.torchft_version()} (lighthouse, 4 replica groups of 1)": _torchft,
}


def run(quick: bool) -> list[Result]:
    kills, trials = (3, 1) if quick else (8, 3)
    ours, failed = _foldplane(kills)
    theirs = {
        name: baselines.measured(name, lambda m=measure: m(trials), _log)
        for name, measure in BASELINES.items()
    }
    return [_row(ours, failed, name, got) for name, got in theirs.items()]


def _row(ours: list[float], failed: list[str], name: str, theirs: Any) -> Result:
    extra = {"samples_s": [round(s, 4) for s in ours], "kills": len(ours) + len(failed),
             "failed_trials": failed}  # fmt: skip
    if isinstance(theirs, Exception):  # a baseline that cannot run here is said so, never faked
        return Result(
            "recovery", METRIC, "s", median(ours), p99=percentile(ours, 99), baseline=name,
            target=TARGET, extra={**extra, "baseline_error": str(theirs)[:500]},
        )  # fmt: skip
    return Result(
        "recovery", METRIC, "s", median(ours), p99=percentile(ours, 99), baseline=name,
        baseline_median=median(theirs), ratio=lower_is_better_ratio(median(ours), median(theirs)),
        target=TARGET, extra={**extra, "baseline_samples_s": [round(s, 3) for s in theirs]},
    )  # fmt: skip


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "foldplane-worker":
        raise SystemExit(_foldplane_worker())
    if mode == "torchrun-worker":
        raise SystemExit(baselines.restart_all_worker("RECOVERY_OUT", WORLD, 50, _torchrun_step))
    if mode == "torchft-worker":
        raise SystemExit(_torchft_worker(int(sys.argv[2]), sys.argv[3]))
    raise SystemExit(f"unknown mode {mode!r}")
