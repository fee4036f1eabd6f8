"""Elastic DDP: the step's overhead, recovery from a SIGKILL, and healing a replacement.

Measured in one run, on one machine, with the same model and step everywhere (an MLP of two
square ``Linear`` layers trained by SGD with momentum, so its state, parameters plus momentum,
is the size named; 4 MB unless said otherwise; batches of 32 synthetic samples):

- **ddp step overhead**: 4 gloo processes hold both a plain ``torch.nn.parallel.
  DistributedDataParallel`` on ``init_process_group("gloo")`` and foldplane's
  ``agent.ddp.DistributedDataParallel`` on the agent's group, over two copies of the model; they
  alternate short blocks of steps (ABBA; 2 steps a block with --quick, the first 3 blocks of
  each a warm-up) and rank 0 times each step (zero_grad, forward, backward,
  optimizer step; foldplane's includes the commit agreement). The row is the ratio of the
  medians, foldplane / plain, with batches of 256 (and a second row with batches of 32: the
  same communication, less compute).
- **ddp recovery**: 4 workers train; one is SIGKILLed; the time from the kill until every
  survivor has committed a step without it. foldplane: the launcher reports the death, the
  coordinator commits a view of 3, the survivors skip the failed step and carry on. torchft
  0.2.0: 4 replica groups of one process with torchft's ``DistributedDataParallel`` and
  ``OptimizerWrapper``'s protocol (synchronous quorum, lighthouse heartbeat timeout 1 s instead
  of its 5 s default). torchft 0.2.0's DDP comm hook asserts (``assert fut._fut``) when the
  allreduce failed because a peer died, after its manager has recorded the error; DDP's reducer
  then refuses every later step ("Expected to have finished reduction in the prior
  iteration"), so no survivor ever commits again. The benchmark's torchft workers run
  torchft's DDP with that one hook fixed: on a failed allreduce, and on the no-op works the
  manager hands out for the rest of a failed step, it hands DDP the bucket as it is, and the
  manager's ``should_commit()`` skips the step as torchft intends. torchrun
  ``--max-restarts=1``: every worker is restarted, until each has finished a DDP step (the
  state would have to come from a checkpoint on top).
- **heal**: after a kill, a replacement process starts and is activated; the time from its
  activation (foldplane: ``activate_ranks`` returned; torchft: its first quorum starts) until it
  holds the model and optimizer state it takes its first step from (foldplane: pulled from the
  heal servers of every member holding the last committed step, a thread in each, straight into
  its own tensors, while the members finish the step they are in; torchft: its checkpoint
  transfer over HTTP from the quorum's source, once the members reached their next quorum), for
  4 MB, 256 MB and 1 GB of state. The 1 GB trials run 3 workers instead of 4 (memory), the
  same number for both systems. ``ready_s`` in the extra says when foldplane's replacement had
  also entered the view with the members (they finish their step first).

The run ends with the elastic HSDP rows (**fsdp step overhead**, **fsdp recovery**) of
``benchmarks/fsdp.py``, where they are described.

Workers are this module, run as ``python benchmarks/ddp.py MODE``; they print one JSON line per
event with wall-clock times (``time.time()``), the clock of the kill.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .harness import Result, lower_is_better_ratio, median, percentile
from .kit.baselines import (
    ReplicaGroups,
    measured,
    restart_all,
    restart_all_worker,
    torchft_manager,
    torchft_version,
)
from .kit.kills import time_recovery
from .kit.service import Service, free_port
from .kit.workers import Lines, abba, emit, say, start_agent

WORLD = 4
BATCH = 32  # recovery and heal; the overhead is measured at 256 and 32
MB = 1 << 20
SIZES = (4, 256, 1024)
WORLDS = {4: WORLD, 256: WORLD, 1024: 3}  # 1 GB: 3 workers (memory), both systems

_log = say("ddp")


# -- the model, the same for every system -------------------------------------------------------


def _width(state_mb: int) -> int:
    """Two ``Linear(w, w)`` layers whose parameters plus momentum take ``state_mb`` MB."""
    params = state_mb * MB // 8  # float32, and as many momentum values as parameters
    return max(8, int((params / 2) ** 0.5))


def _model(state_mb: int, seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    w = _width(state_mb)
    return torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w))


def _optimizer(params: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def _batch(state_mb: int, step: int, rank: int, batch: int = BATCH) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(step * 1009 + rank)
    w = _width(state_mb)
    x = torch.randn(batch, w, generator=g)
    return x, x.roll(1, dims=1)


def _train_step(
    model: Any, opt: Any, state_mb: int, step: int, rank: int, batch: int = BATCH
) -> Any:
    import torch

    opt.zero_grad()
    x, y = _batch(state_mb, step, rank, batch)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return opt.step()


# -- foldplane groups ----------------------------------------------------------------------------


def _launch(
    service: Service, mode: str, *args: str, env: dict[str, str] | None = None, world: int = WORLD
) -> tuple[Any, Lines]:
    """A fresh group of ``world`` workers running ``mode``, and their lines."""
    group = service.new_group("ddp", world)
    lines = Lines()
    launcher = service.launch(
        [sys.executable, "-m", __name__, mode, *args], group, range(world), lines.follow,
        env={"OMP_NUM_THREADS": "1", **(env or {})},
    )  # fmt: skip
    return launcher, lines


# -- ddp step overhead ---------------------------------------------------------------------------


def _overhead(service: Service, blocks: int, steps: int, batch: int) -> dict[str, list[float]]:
    launcher, lines = _launch(
        service, "fp-overhead", str(blocks), str(steps), str(batch),
        env={"BENCH_GLOO_PORT": str(free_port())},
    )  # fmt: skip
    try:
        got: dict[str, list[float]] = {}

        def done(line: dict[str, Any]) -> bool:
            if "times" in line:
                got.setdefault(line["system"], []).extend(line["times"])
            return "finished" in line

        lines.until(done, 900, "the overhead run")
        return got
    finally:
        launcher.stop(grace_s=5)


def _fp_overhead_worker(blocks: int, steps: int, batch: int) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from ..agent.ddp import DistributedDataParallel, ElasticOptimizer

    agent = start_agent()
    rank = agent.rank
    port = os.environ["BENCH_GLOO_PORT"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)  # fmt: skip
    pg = agent.process_group()  # registered next to the default gloo group
    plain = TorchDDP(_model(4))
    plain_opt = _optimizer(plain.parameters())
    ours = DistributedDataParallel(_model(4), pg)
    ours_opt = ElasticOptimizer(ours, _optimizer(ours.parameters()))
    systems = {"plain": (plain, plain_opt), "foldplane": (ours, ours_opt)}

    def step(name: str, n: int) -> None:
        _train_step(*systems[name], 4, n, rank, batch)

    for b, name, times in abba(blocks, steps, list(systems), step):
        if rank == 0 and b > 2:  # the first blocks of each warm up
            emit(system=name, times=times)
    if rank == 0:
        emit(finished=True)
    threading.Event().wait()  # the benchmark stops the workers
    return 0


# -- foldplane recovery and heal -----------------------------------------------------------------


def _fp_trial(
    service: Service, state_mb: int, victim: int, world: int
) -> tuple[float, dict[str, Any]]:
    """Kill ``victim``; (kill -> every survivor committed without it, the replacement's heal)."""
    launcher, lines = _launch(service, "fp-train", str(state_mb), world=world)
    try:
        steps: dict[int, int] = {}

        def warmed(line: dict[str, Any]) -> bool:
            if "steps" in line:
                steps[line["rank"]] = line["steps"]
            return len(steps) == world and min(steps.values()) >= (3 if state_mb <= 4 else 1)

        lines.until(warmed, 300, "formation")

        def without_victim(line: dict[str, Any], _: float) -> int | None:
            return line["rank"] if line.get("members") == world - 1 else None

        recovery = time_recovery(
            lines, lambda: launcher.kill(victim), set(range(world)) - {victim}, without_victim,
            300, f"recovery from the kill of rank {victim}",
        )  # fmt: skip
        where = {  # where a recovery's time went
            rank: f"skip +{line['skipped'] - recovery.killed_at:.3f} s, step in view "
            f"{line['view']} began +{line['step_began'] - recovery.killed_at:.3f} s"
            for rank, line in recovery.first.items()
            if "skipped" in line
        }
        _log(f"foldplane {state_mb} MB: {where}")
        launcher.replace(victim)
        heal: list[dict[str, Any]] = []

        def healed(line: dict[str, Any]) -> bool:
            if "heal_s" in line:
                heal.append(line)
            return bool(heal)

        lines.until(healed, 300, "the replacement's heal")
        return recovery.seconds, heal[0]
    finally:
        launcher.stop(grace_s=5)


def _fp_train_worker(state_mb: int) -> int:
    from ..agent.ddp import DistributedDataParallel, ElasticOptimizer

    agent = start_agent()
    rank = agent.rank
    pg = agent.process_group()
    model = DistributedDataParallel(_model(state_mb, seed=rank), pg)
    opt = ElasticOptimizer(model, _optimizer(model.parameters()))
    if rank not in agent.view.active_ranks:  # a replacement: activate, then time the heal
        agent.wait_for_state("HEALTHY", timeout=300)
        agent.activate_ranks([rank], wait_s=120)
        t0 = time.time()
        model.begin_step()  # pulls the members' state, then enters the view with them
        ready = time.time()
        heal = model.last_heal
        emit(
            rank=rank,
            heal_s=(heal.finished_at if heal is not None else ready) - t0,
            ready_s=ready - t0,
            pull_s=heal.seconds if heal is not None else None,
            sources=list(heal.sources) if heal is not None else [],
            steps=model.committed_steps,
        )
    step = 0
    skipped_at: float | None = None
    while True:
        step += 1
        t0 = time.time()
        if _train_step(model, opt, state_mb, step, rank):
            line = {"rank": rank, "t": time.time(), "steps": model.committed_steps}
            if skipped_at is not None:  # where a recovery's time went
                line.update(skipped=skipped_at, step_began=t0)
                skipped_at = None
            emit(**line, members=len(model.members), view=model.view_version)
        elif skipped_at is None:
            skipped_at = time.time()


# -- torchft -------------------------------------------------------------------------------------


def _torchft_trial(state_mb: int, world: int = WORLD) -> tuple[float, float]:
    """4 replica groups; kill one; (kill -> survivors committed with 3, the restarted one's heal)."""
    with ReplicaGroups(
        lambda r, address: [sys.executable, "-m", __name__, "ft-train", str(r), address, str(state_mb)],
        world,
    ) as replicas:
        try:
            replicas.formed(3 if state_mb <= 4 else 1)
            recovery = replicas.kill_last()
            replicas.start(world - 1)
            heal: list[float] = []

            def healed(line: dict[str, Any]) -> bool:
                if "heal_s" in line:
                    heal.append(line["heal_s"])
                return bool(heal)

            replicas.lines.until(healed, 300, "torchft heal")
            return recovery, heal[0]
        except Exception:
            _log(replicas.tails())
            raise


def _ft_train_worker(replica: int, lighthouse: str, state_mb: int) -> int:
    import torch
    from torchft import DistributedDataParallel, Manager
    from torchft.optim import OptimizerWrapper

    module = _model(state_mb, seed=replica)
    inner = _optimizer(module.parameters())
    loaded: list[float] = []

    def load_state_dict(state: dict[str, Any]) -> None:
        module.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        loaded.append(time.time())

    manager = torchft_manager(
        replica, lighthouse, timeout_s=30, quorum_timeout_s=120, load_state_dict=load_state_dict,
        state_dict=lambda: {"model": module.state_dict(), "optim": inner.state_dict()},
    )  # fmt: skip

    def fixed_hook(state, bucket):  # noqa: ANN001, ANN202 (annotated below: DDP checks classes)
        work = state.allreduce(bucket.buffer())
        ok = work.wait()
        future = work.get_future()
        # a managed work's future wraps torch's (torchft's own hook returns that); once the
        # step has failed, the manager hands out no-op works whose future is torch's own
        inner = getattr(future, "_fut", future)
        if ok and inner is not None:
            return inner
        # the manager holds the error, so should_commit() skips the step; 0.2.0's hook
        # asserts here instead, and the reducer then refuses every later step
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    fixed_hook.__annotations__ = {
        "state": Manager,
        "bucket": torch.distributed.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }

    class FixedHookDDP(DistributedDataParallel):
        """torchft's DDP with its comm hook's error path fixed (see the module docstring)."""

        _comm_hook = staticmethod(fixed_hook)

    model = FixedHookDDP(manager, module)
    opt = OptimizerWrapper(manager, inner)
    step = 0
    while True:
        step += 1
        t0 = time.time()
        opt.zero_grad()  # the quorum; a replica behind heals here (synchronous quorum)
        if loaded and step == 1:
            emit(replica=replica, heal_s=loaded[0] - t0)
        x, y = _batch(state_mb, step, replica)
        torch.nn.functional.mse_loss(model(x), y).backward()
        committed = manager.should_commit()
        if committed:
            inner.step()
            emit(replica=replica, participants=manager.num_participants(), t=time.time())


# -- torchrun ------------------------------------------------------------------------------------


def _torchrun(trials: int) -> list[float]:
    return restart_all(__name__, "torchrun-train", "BENCH_OUT", WORLD, trials, _log)


def _torchrun_step(rank: int) -> Callable[[int], object]:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    model = TorchDDP(_model(4))
    opt = _optimizer(model.parameters())
    return lambda n: _train_step(model, opt, 4, n, rank)


# -- the benchmark -------------------------------------------------------------------------------


def _heal_name(size: int) -> str:
    return "heal 1 GB" if size == 1024 else f"heal {size} MB"


def run(quick: bool) -> list[Result]:
    blocks, steps = (30, 2) if quick else (80, 4)
    kills, trials = (1, 1) if quick else (3, 2)
    # heal trials per size: the 4 MB ones are the recovery trials too
    fp_trials = {4: kills, 256: 1 if quick else 3, 1024: 1 if quick else 2}
    ft_trials = {4: trials, 256: 1 if quick else 3, 1024: 1 if quick else 2}
    with Service(store=True, name="ddp").start() as service:
        overhead = {batch: _overhead(service, blocks, steps, batch) for batch in (256, 32)}
        fp_recovery, fp_heal = _foldplane_trials(service, fp_trials)
    ft_recovery, ft_heal = _torchft_trials(ft_trials)
    torchrun = measured("torchrun", lambda: _torchrun(trials), _log)
    results = [_overhead_row(batch, times) for batch, times in overhead.items()]
    results += _recovery_rows(fp_recovery[4], ft_recovery[4], torchrun)
    results += _heal_rows(fp_recovery, fp_heal, ft_recovery, ft_heal)
    from . import fsdp  # the HSDP rows belong to this run too

    results.extend(fsdp.run(quick))
    return results


def _foldplane_trials(
    service: Service, trials: dict[int, int]
) -> tuple[dict[int, list[float]], dict[int, list[dict[str, Any]]]]:
    """Per state size: the recoveries and the replacements' heals (the trials that ran)."""
    recovery: dict[int, list[float]] = {s: [] for s in SIZES}
    heal: dict[int, list[dict[str, Any]]] = {s: [] for s in SIZES}
    for size in SIZES:
        world = WORLDS[size]
        for k in range(trials[size]):
            victim = 1 + k % (world - 1)
            got = measured(
                f"foldplane {size} MB",
                lambda s=size, v=victim, w=world: _fp_trial(service, s, v, w), _log,
            )  # fmt: skip
            if isinstance(got, Exception):
                _log(f"workers.log ends with:\n{service.tail('workers.log')}")
                continue
            recovery[size].append(got[0])
            heal[size].append(got[1])
            _log(f"foldplane {size} MB kill of rank {victim}: recovery {got[0]:.3f} s, "
                 f"heal {got[1]}")  # fmt: skip
    return recovery, heal


def _torchft_trials(
    trials: dict[int, int],
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    recovery: dict[int, list[float]] = {s: [] for s in SIZES}
    heal: dict[int, list[float]] = {s: [] for s in SIZES}
    for size in SIZES:
        for _ in range(trials[size]):
            got = measured(f"torchft {size} MB", lambda s=size: _torchft_trial(s, WORLDS[s]), _log)
            if isinstance(got, Exception):
                continue
            recovery[size].append(got[0])
            heal[size].append(got[1])
            _log(f"torchft {size} MB: recovery {got[0]:.3f} s, heal {got[1]:.3f} s")
    return recovery, heal


def _overhead_row(batch: int, times: dict[str, list[float]]) -> Result:
    ours, plain = median(times["foldplane"]), median(times["plain"])
    _log(f"batch {batch}: foldplane {ours * 1e3:.2f} ms, plain DDP {plain * 1e3:.2f} ms")
    return Result(
        "ddp", "ddp step overhead" + ("" if batch == 256 else f", batch {batch}"), "x",
        ours / plain,
        baseline="plain DDP on init_process_group('gloo'), same processes (ABBA)",
        baseline_median=1.0, target="<= 1.05" if batch == 256 else None,
        extra={"foldplane_step_ms": round(ours * 1e3, 3),
               "plain_step_ms": round(plain * 1e3, 3), "batch": batch,
               "steps_each": len(times["foldplane"]), "state_mb": 4},
    )  # fmt: skip


def _recovery_rows(ours: list[float], torchft: list[float], torchrun: Any) -> list[Result]:
    if not ours:
        return []
    rows = []
    for name, theirs in (
        (f"{torchft_version()} DDP (lighthouse, 4 replica groups of 1)", torchft),
        ("torchrun --max-restarts=1 (restart all, DDP rebuilt)", torchrun),
    ):
        ok = isinstance(theirs, list) and bool(theirs)
        rows.append(
            Result(
                "ddp", "ddp recovery", "s", median(ours), p99=percentile(ours, 99),
                baseline=name, baseline_median=median(theirs) if ok else None,
                ratio=lower_is_better_ratio(median(ours), median(theirs)) if ok else None,
                target=">= 10x torchft",
                extra={"samples_s": [round(s, 3) for s in ours],
                       "baseline_samples_s": [round(s, 3) for s in theirs] if ok else str(theirs)[:300]},
            )
        )  # fmt: skip
    return rows


def _heal_rows(
    fp_recovery: dict[int, list[float]],
    fp_heal: dict[int, list[dict[str, Any]]],
    ft_recovery: dict[int, list[float]],
    ft_heal: dict[int, list[float]],
) -> list[Result]:
    rows = []
    for size in SIZES:
        heals = fp_heal[size]
        if not heals:
            continue
        mine = [h["heal_s"] for h in heals]
        theirs = ft_heal[size]
        rows.append(
            Result(
                "ddp", _heal_name(size), "s", median(mine),
                baseline=f"{torchft_version()} checkpoint heal (HTTP)",
                baseline_median=median(theirs) if theirs else None,
                ratio=lower_is_better_ratio(median(mine), median(theirs)) if theirs else None,
                target=">= 1.5x torchft" if size == 256 else ">= 1.0x torchft",
                extra={"samples_s": [round(s, 3) for s in mine],
                       "baseline_samples_s": [round(s, 3) for s in theirs],
                       "ready_s": [round(h["ready_s"], 3) for h in heals],
                       "pull_s": [None if h["pull_s"] is None else round(h["pull_s"], 3)
                                  for h in heals],
                       "sources": [h["sources"] for h in heals],
                       "workers": WORLDS[size],
                       "recovery_at_this_size_s": [round(s, 3) for s in fp_recovery[size]],
                       "torchft_recovery_at_this_size_s": [round(s, 3) for s in ft_recovery[size]]},
            )
        )  # fmt: skip
    return rows


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "fp-overhead":
        raise SystemExit(_fp_overhead_worker(*(int(a) for a in sys.argv[2:5])))
    if mode == "fp-train":
        raise SystemExit(_fp_train_worker(int(sys.argv[2])))
    if mode == "ft-train":
        raise SystemExit(_ft_train_worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    if mode == "torchrun-train":
        raise SystemExit(restart_all_worker("BENCH_OUT", WORLD, 20, _torchrun_step))
    raise SystemExit(f"unknown mode {mode!r}")
