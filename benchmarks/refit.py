"""Weight refit, 2 trainers (TP=2) to 4 generators (TP=4): foldplane's data plane versus the
broadcast loop a user writes by hand, in the same 6 gloo processes on loopback.

The model is 256 MB of float32: 8 matrices of 2048 x 4096, alternately column-parallel (split
along dim 0) and row-parallel (split along dim 1), plus a replicated norm (the misc payload).
- **foldplane**: ``agent.refit.open_world`` (world opened once, 4 lanes) and
  ``RefitWorld.transfer``: each generator receives its quarter of each matrix from the trainer
  that holds it, straight into its own tensors; the time ends when every member has finished.
- **baseline**: one ``init_process_group("gloo")`` of all 6 ranks; trainer rank 0, holding the
  full state dict (its gather is not counted), sends each full tensor with ``dist.broadcast``,
  and each generator copies its shard out of it.
The same transfer over a world of 1 lane runs in the same trials (``one_lane_s``), to show what
the lanes add. Trials alternate (ABBA) after a barrier of all 6; a trial's time is its slowest member's.
Every path is checked bit-identical to the trainer's state dict once. Target: foldplane at
least 1.5x faster (ratio = baseline / foldplane).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
import warnings
from typing import Any

from benchmarks.harness import Result, lower_is_better_ratio, median

BENCH = "refit"
ROWS, COLS, MATRICES = 2048, 4096, 8
LANES = 4
MEMBERS = [("publisher", 0), ("publisher", 1)] + [("subscriber", s) for s in range(4)]
BASELINE = "torch.distributed broadcast of each full tensor from trainer rank 0, one gloo group of all 6 ranks"


def _plan() -> Any:
    from wire.refit import MeshSpec, make_plan, megatron_layout

    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    roles: dict[str, str] = {}
    for i in range(MATRICES):
        name = f"layers.{i}.weight"
        tensors[name] = ("float32", (ROWS, COLS) if i % 2 == 0 else (COLS, ROWS))
        roles[name] = "column" if i % 2 == 0 else "row"
    tensors["norm.weight"] = ("float32", (ROWS,))
    roles["norm.weight"] = "replicated"
    trainer = MeshSpec(name="trainer", size=2, tp=2)
    generator = MeshSpec(name="generator", size=4, tp=4)
    return make_plan(
        megatron_layout(trainer, tensors, roles),
        megatron_layout(generator, tensors, roles),
        misc=("norm.weight",),
    )


def _full(name: str, shape: tuple[int, ...]) -> Any:
    """The trainer's full tensor ``name``: distinct values, cheap to make on every member."""
    import torch

    salt = sum(map(ord, name))
    return (torch.arange(math.prod(shape), dtype=torch.float32) + salt).reshape(shape)


def _member(
    side: str, slot: int, port: int, bootstraps: tuple[dict, dict], trials: int, out: Any
) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore

    from agent.refit import empty_shards, local_shards, local_view, open_world

    plan = _plan()
    rank = slot if side == "publisher" else 2 + slot
    store = TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo", store=PrefixStore("baseline/", store), rank=rank, world_size=6)
    shapes = {p.name: p.shape for p in plan.publisher.params}
    full = {n: _full(n, s) for n, s in shapes.items()} if rank == 0 else None
    if side == "publisher":
        state = {n: _full(n, s) for n, s in shapes.items()}
        tensors = local_shards(state, plan, "publisher", slot)
        del state
    else:
        tensors = empty_shards(plan, "subscriber", slot)
    world = open_world(plan, side, slot, bootstraps[0], LANES, timeout_s=120.0)
    one_lane = open_world(plan, side, slot, bootstraps[1], 1, timeout_s=120.0)
    layout = plan.layout(side)  # type: ignore[arg-type]
    buffers = {s: torch.empty(s) for s in set(shapes.values())} if rank != 0 else {}

    def baseline() -> None:
        for name, shape in shapes.items():
            buf = full[name] if full is not None else buffers[shape]
            dist.broadcast(buf, src=0)
            if side == "subscriber":
                view = local_view(buf, layout, name, slot)
                if view is not None:
                    tensors[name].copy_(view)

    def ours() -> None:
        world.transfer(tensors)

    def ours_one_lane() -> None:
        one_lane.transfer(tensors)

    def check() -> bool:
        if side == "publisher":
            return True
        for name, t in tensors.items():
            want = local_view(_full(name, shapes[name]), layout, name, slot)
            if not torch.equal(t, want):
                return False
        return True

    paths = (("baseline", baseline), ("ours", ours), ("one_lane", ours_one_lane))
    times: dict[str, list[float]] = {name: [] for name, _ in paths}
    identical = {}
    for name, fn in paths:  # warm up, and check each path
        for t in tensors.values():
            if side == "subscriber":
                t.fill_(-1)
        dist.barrier()
        fn()
        identical[name] = check()
    for i in range(trials):
        for name, fn in paths if i % 2 == 0 else paths[::-1]:
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    out.put((rank, times, identical))
    world.close()
    one_lane.close()
    dist.destroy_process_group()


def _measure_transfer(quick: bool) -> list[Result]:
    from agent.refit import RefitStore

    trials = 2 if quick else 6
    host = RefitStore()
    bootstraps = (host.bootstrap("gloo"), host.bootstrap("gloo"))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(side, slot, host.port, bootstraps, trials, out))
        for side, slot in MEMBERS
    ]
    for p in procs:
        p.start()
    got = dict(
        (rank, (times, identical))
        for rank, times, identical in (out.get(timeout=1200) for _ in procs)
    )
    for p in procs:
        p.join(60)
    host.close()
    # a trial ends when its slowest member is done
    per_trial = {
        name: [max(got[r][0][name][i] for r in got) for i in range(trials)]
        for name in ("baseline", "ours", "one_lane")
    }
    ours, base = median(per_trial["ours"]), median(per_trial["baseline"])
    mb = (ROWS * COLS * 4 * MATRICES + ROWS * 4) / 2**20
    return [
        Result(
            BENCH,
            "refit 256 MB 2->4",
            "s",
            ours,
            baseline=BASELINE,
            baseline_median=base,
            ratio=lower_is_better_ratio(ours, base),
            target=">= 1.5x",
            extra={
                "trials_each": trials,
                "lanes": LANES,
                "model_mb": round(mb, 1),
                "foldplane_mb_s": round(mb / ours, 1),
                "baseline_mb_s": round(mb / base, 1),
                "one_lane_s": round(median(per_trial["one_lane"]), 3),
                "bit_identical": all(all(i.values()) for _, i in got.values()),
                "samples_s": [round(x, 3) for x in per_trial["ours"]],
                "baseline_samples_s": [round(x, 3) for x in per_trial["baseline"]],
            },
        )
    ]


def run(quick: bool) -> list[Result]:
    results: list[Result] = []
    for measure in (_measure_transfer,):
        results.extend(measure(quick))
    return results
