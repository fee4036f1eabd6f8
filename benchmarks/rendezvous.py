"""torchrun's restart after a worker's death, on foldplane's rendezvous and on torch's own c10d.

One job, the same command line on both backends but ``--rdzv-backend`` and its endpoint: two
torchrun nodes on this machine (``--nnodes 1:4 --nproc-per-node 2 --max-restarts 3
--rdzv-conf last_call_timeout=1``, torch's shortest last call, on both), four workers of
``examples/train_torchrun.py`` (a plain DDP script, ``init_process_group("gloo")``, a checkpoint
every step). Once all four trained, the worker of rank 3 is SIGKILLed; its torchrun restarts
its workers and joins the next round; the other node sees it waiting (or its workers fail) and
does the same.

Measured: from the kill to the moment every worker of the new round has finished a training
step (a process started after the kill; ``benchmarks.kit.torchrun``). Each trial is a fresh
job (foldplane: on one coordinator, a SQLite log; c10d: a TCPStore on the first node, its
default, the one the stale-port failure of docs/torchrun.md happens on), the two backends'
trials interleaved. An attempt that does not train again within :data:`BOUND_S` is counted as
a **failure** when a torchrun gave up (its restarts spent: the restarted workers dialled a dead
round's ports) and as a **hang** when every torchrun still runs (torch's c10d can do both here:
docs/torchrun.md); both are said, with the nodes' log tails, never part of the median.

Two rows, one per peer measured in the same run: torch's c10d as it comes, and c10d with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (each round's workers get a store of their own, the
switch the recovery benchmark's torchrun peer needs to restart at all). Each row's ratio is the
peer's median over foldplane's (above 1: foldplane trains again sooner); its target is "no
slower than c10d" (ratio >= 1.0). A peer none of whose attempts trained again has no ratio:
its row says how many failed and how many hung.
"""

from __future__ import annotations

from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile
from .kit.service import NO_AUTH, Service, free_port
from .kit.torchrun import TorchrunJob
from .kit.workers import say

METRIC = "torchrun restart kill 1 of 4 -> training again"
TARGET = ">= 1.0x c10d (no slower than torchrun's own c10d)"
#: How long an attempt may take to train again before it counts as a hang.
BOUND_S = 120.0
#: Steps every worker trains before the kill.
WARM_STEPS = 3
SCRIPT_ARGS = ("--steps", "100000", "--step-pause", "0.05")
CONF = {"last_call_timeout": "1"}

_log = say("rendezvous")


class NotAgain(Exception):
    """A trial that did not train again within the bound: ``how`` is ``hang`` or ``failure``."""

    def __init__(self, how: str, detail: str) -> None:
        super().__init__(f"{how}: {detail}")
        self.how = how


def _trial(backend: str, endpoint: str, job: str, env: dict[str, str]) -> float:
    """One job: train, kill rank 3's worker, the seconds until training again (:class:`NotAgain`
    otherwise, with the nodes' log tails)."""
    with TorchrunJob(
        backend=backend, endpoint=endpoint, job=job, conf=CONF, env={**NO_AUTH, **env},
        script_args=SCRIPT_ARGS, name=f"bench-{backend}",
    ) as run:  # fmt: skip
        run.start()
        try:
            run.trained(WARM_STEPS, timeout=300)
            killed_at = run.kill_worker(3)
            return run.trained_again(killed_at, BOUND_S)
        except TimeoutError as exc:
            codes = [p.poll() for p in run.procs]
            gave_up = [f"node {n} exited with {c}" for n, c in enumerate(codes) if c is not None]
            how = "failure" if gave_up else "hang"
            what = "; ".join(gave_up) or f"every torchrun still running after {BOUND_S:g} s"
            raise NotAgain(how, f"{what}; {exc}\n{run.tails()}") from None


#: The systems of a trial: foldplane's backend, and torch's c10d as it comes and with the
#: switch that keeps the agents' store out of the workers' hands (the recovery benchmark's peer).
SYSTEMS: dict[str, dict[str, str]] = {
    "foldplane": {},
    "c10d": {},
    "c10d-no-shared-store": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
}
BASELINES = {
    "c10d": "torchrun --rdzv-backend c10d (same job, same flags)",
    "c10d-no-shared-store": "torchrun --rdzv-backend c10d, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
}


def run(quick: bool) -> list[Result]:
    trials = 2 if quick else 5
    samples: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    missed = {name: {"hang": [], "failure": []} for name in SYSTEMS}
    order = list(SYSTEMS)
    with Service(name="rendezvous").start() as service:
        for k in range(trials):
            for name in order[k % len(order) :] + order[: k % len(order)]:
                backend = "foldplane" if name == "foldplane" else "c10d"
                endpoint = service.url if backend == "foldplane" else f"127.0.0.1:{free_port()}"
                try:
                    seconds = _trial(backend, endpoint, f"bench-{name}-{k + 1}", SYSTEMS[name])
                except NotAgain as exc:
                    missed[name][exc.how].append(f"trial {k + 1}: {str(exc)[:300]}")
                    _log(f"{name} trial {k + 1}/{trials}: {exc.how.upper()} (no training "
                         f"within {BOUND_S:g} s): {str(exc)[-1500:]}")  # fmt: skip
                    continue
                samples[name].append(seconds)
                _log(f"{name} trial {k + 1}/{trials}: {seconds:.3f} s")
    ours = samples["foldplane"]
    if not ours:
        raise RuntimeError(f"no foldplane trial trained again: {missed['foldplane']}")
    return [_row(ours, missed["foldplane"], name, samples[name], missed[name], trials)
            for name in BASELINES]  # fmt: skip


def _row(
    ours: list[float],
    our_misses: dict[str, list[str]],
    name: str,
    theirs: list[float],
    their_misses: dict[str, list[str]],
    trials: int,
) -> Result:
    extra: dict[str, Any] = {
        "samples_s": [round(s, 3) for s in ours],
        "baseline_samples_s": [round(s, 3) for s in theirs],
        "trials": trials,
        "hangs": len(our_misses["hang"]),
        "failures": len(our_misses["failure"]),
        "baseline_hangs": len(their_misses["hang"]),
        "baseline_failures": len(their_misses["failure"]),
        "baseline_missed": their_misses,
        "bound_s": BOUND_S,
    }
    if not theirs:  # no attempt of the peer trained again: said so, never faked
        return Result(
            "rendezvous", METRIC, "s", median(ours), p99=percentile(ours, 99),
            baseline=BASELINES[name], target=TARGET,
            extra={**extra, "baseline_error": f"no attempt of {trials} trained again within "
                   f"{BOUND_S:g} s ({len(their_misses['failure'])} failed, "
                   f"{len(their_misses['hang'])} hung)"},
        )  # fmt: skip
    return Result(
        "rendezvous", METRIC, "s", median(ours), p99=percentile(ours, 99),
        baseline=BASELINES[name], baseline_median=median(theirs),
        ratio=lower_is_better_ratio(median(ours), median(theirs)), target=TARGET, extra=extra,
    )  # fmt: skip
