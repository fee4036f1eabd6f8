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

The control plane's rows run the whole lifecycle (docs/refit.md): a coordinator
(``python -m coordinator serve``, uvicorn on 127.0.0.1, SQLite on disk), two launchers (2
trainers, TP=2; 4 generators, TP=4, replaced when one dies) and real Agents in this module's
worker (``python -m foldplane.facets.refits.benchmark worker``), moving an 8 MB model over 4 lanes. Each worker
joins the refit's epoch (publisher slot 0 offers the bootstrap with its join, so it comes with
the admission), opens the epoch's world while the transfer starts (a thread waits for that),
moves its shards, reports and waits for the transfer to complete; one JSON line per event on
stdout, with wall-clock times (``time.time()``, the clock the log stamps records with). A
worker closes an epoch's world as soon as the epoch moves, before it joins the next one.

- **refit control overhead**: admission to first byte. Between trials an operator's restart
  moves the epoch, so each trial is a fresh admission. From the ``ts`` of the log record that
  admitted the epoch (the last slot's ``refit_join``; its offset is in the epoch's update) to
  the first send a trainer posts on a lane (``TransferReport.first_posted_at``). In between:
  the update reaching every worker (the bootstrap with it, published in the admitting step),
  then, at the same time, the transfer's start (an event through the log) and the world's
  formation (4 lanes over 6 ranks). The notes give each step's median, each as the time from
  admission to the last member done with it.
- **refit recovery**: a generator SIGKILLs itself in a transfer's first attempt, once the
  others are inside it; from the kill to the ``ts`` of the log record that completed the
  retry (every member reported done) on the new views, with the launcher's replacement.

Neither has a peer measured here: no other system runs this lifecycle.

The refits facet's benchmark, in its folder (its plugin's ``benchmarks``: ``python -m
benchmarks refit``).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...benchmarks.harness import Result, lower_is_better_ratio, median
from ...benchmarks.kit.service import Service
from ...benchmarks.kit.workers import Lines, emit, say

BENCH = "refit"
ROWS, COLS, MATRICES = 2048, 4096, 8
LANES = 4
MEMBERS = [("publisher", 0), ("publisher", 1)] + [("subscriber", s) for s in range(4)]
BASELINE = "torch.distributed broadcast of each full tensor from trainer rank 0, one gloo group of all 6 ranks"


def _plan(rows: int = ROWS, cols: int = COLS) -> Any:
    from ...wire.refit import MeshSpec, make_plan, megatron_layout

    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    roles: dict[str, str] = {}
    for i in range(MATRICES):
        name = f"layers.{i}.weight"
        tensors[name] = ("float32", (rows, cols) if i % 2 == 0 else (cols, rows))
        roles[name] = "column" if i % 2 == 0 else "row"
    tensors["norm.weight"] = ("float32", (rows,))
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

    from ...agent.refit import empty_shards, local_shards, local_view, open_world

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
    from ...agent.refit import RefitStore

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


# -- the control plane: admission to first byte, and recovery -----------------------------------

#: The control plane's rows move an 8 MB model (8 matrices of 256 x 1024 float32, and the norm).
CTL_ROWS, CTL_COLS = 256, 1024
REFIT = "rl"
GROUPS = (("train", 2), ("gen", 4))


def _victim(kill: int) -> int:
    """The generator slot that dies in recovery trial ``kill``."""
    return 1 + kill % 3


_log = say("refit")


def _transferred(lines: Lines, key: str) -> list[dict[str, Any]]:
    """The latest ``transferred`` line of ``key`` from each slot."""
    got = {
        (e["side"], e["slot"]): e
        for e in lines.seen
        if e["event"] == "transferred" and e["key"] == key
    }
    return list(got.values())


def _record_ts(db: str, offsets: set[int]) -> dict[int, float]:
    """The ``ts`` (seconds) of the log's records at ``offsets``."""
    import asyncio

    from ...eventlog import open_log

    async def read() -> dict[int, float]:
        log = await open_log(db, create=False)
        try:
            out = {}
            for offset in sorted(offsets):
                [rec] = await log.read(offset - 1, 1)
                out[offset] = rec.ts / 1e9
            return out
        finally:
            await log.close()

    return asyncio.run(read())


def _measure_control(quick: bool) -> list[Result]:
    controls, kills = (3, 1) if quick else (5, 3)
    with Service(store=True, name="refit").start() as service:
        lines = Lines()
        launchers: list[Any] = []
        try:
            _declare(service)
            for group, size in GROUPS:
                launchers.append(
                    service.launch(
                        [sys.executable, "-m", __name__, "worker", str(service.dir), str(controls),
                         str(kills)],
                        group, range(size), lines.follow, replace_failed=group == "gen",
                        max_replacements=kills + 1,
                    )
                )  # fmt: skip
            _wait_transfers(service, lines, controls, kills)
        except Exception:
            _log(service.tails())
            raise
        finally:
            for launcher in launchers:
                launcher.stop(grace_s=10)
            service.stop()
        return _control_results(lines, service.db, controls, kills)


def _declare(service: Service) -> None:
    """The two groups, and the refit from the trainers to the generators."""
    for group, size in GROUPS:
        service.create_group(group, size, heartbeat_timeout_s=10.0)
    service.client.request(
        "POST",
        "/refits",
        json={
            "refit": REFIT,
            "publisher": "train",
            "subscriber": "gen",
            "publisher_slots": 2,
            "subscriber_slots": 4,
            "lanes": LANES,
            "readiness_timeout_s": 600,
        },
    )


def _wait_transfers(service: Service, lines: Lines, controls: int, kills: int) -> None:
    """Every key transferred by all 6 members; an operator's restart between control keys."""
    for k in range(controls):
        key = f"control-{k}"
        lines.wait_for(lambda key=key: len(_transferred(lines, key)) == 6, 300, key)
        _log(f"{key} transferred")
        if k < controls - 1:  # the next trial is a fresh admission
            service.client.request(
                "POST", f"/refits/{REFIT}/restart", json={"reason": "the next trial"}
            )
    for k in range(kills):
        key = f"recovery-{k}"
        lines.wait_for(lambda key=key: len(_transferred(lines, key)) == 6, 300, key)
        _log(f"{key} transferred")


def _control_results(lines: Lines, db: str, controls: int, kills: int) -> list[Result]:
    done = {
        key: _transferred(lines, key)
        for key in [f"control-{k}" for k in range(controls)]
        + [f"recovery-{k}" for k in range(kills)]
    }
    offsets = {e["admitted_offset"] for es in done.values() for e in es}
    offsets |= {e["completed_offset"] for es in done.values() for e in es}
    ts = _record_ts(db, offsets)
    ms = 1e3

    def after(es: list[dict], field: str, since: float) -> float:
        return (max(e[field] for e in es) - since) * ms

    first_byte, steps = [], {"update": [], "bootstrap": [], "transfer": [], "world": []}
    for k in range(controls):
        es = done[f"control-{k}"]
        [admitted] = {e["admitted_offset"] for e in es}
        at = ts[admitted]
        first_byte.append(
            (min(e["first_posted_at"] for e in es if e["side"] == "publisher") - at) * ms
        )
        for step, field in (
            ("update", "joined_at"),
            ("bootstrap", "bootstrap_at"),
            ("transfer", "transfer_at"),
            ("world", "opened_at"),
        ):
            steps[step].append(after(es, field, at))
    recovery, detected, respawned, readmitted = [], [], [], []
    for k in range(kills):
        key = f"recovery-{k}"
        [dying] = [e for e in lines.seen if e["event"] == "dying" and e["key"] == key]
        killed = dying["t"]
        es = done[key]
        [completed] = {e["completed_offset"] for e in es}
        recovery.append(ts[completed] - killed)
        failed = [e["t"] for e in lines.seen if e["event"] == "attempt_failed" and e["key"] == key]
        detected.append((min(failed) - killed) * ms)
        spawned = [
            e["t"]
            for e in lines.seen
            if e["event"] == "spawned" and e["side"] == "subscriber" and e["t"] > killed
        ]
        respawned.append(min(spawned) - killed)
        [admitted] = {e["admitted_offset"] for e in es}
        readmitted.append(ts[admitted] - killed)
    identical = all(e["identical"] for es in done.values() for e in es)
    return [
        Result(
            BENCH,
            "refit control overhead",
            "ms",
            median(first_byte),
            target="<= 50 ms",
            extra={
                "note": "no peer: no other system admits refit members; from the admitting "
                "log record's ts to the first send a trainer posts",
                "trials": controls,
                "lanes": LANES,
                "model_mb": round((CTL_ROWS * CTL_COLS * MATRICES + CTL_ROWS) * 4 / 2**20, 1),
                "update_ms": round(median(steps["update"]), 1),
                "bootstrap_ms": round(median(steps["bootstrap"]), 1),
                "transfer_started_ms": round(median(steps["transfer"]), 1),
                "world_open_ms": round(median(steps["world"]), 1),
                "bit_identical": identical,
                "samples_ms": [round(x, 1) for x in first_byte],
            },
        ),
        Result(
            BENCH,
            "refit recovery",
            "s",
            median(recovery),
            extra={
                "note": "no peer; from the SIGKILL to the log record that completed the retry",
                "kills": kills,
                "failed_seen_ms": round(median(detected), 1),
                "replacement_spawned_s": round(median(respawned), 2),
                "readmitted_s": round(median(readmitted), 2),
                "bit_identical": identical,
                "samples_s": [round(x, 2) for x in recovery],
            },
        ),
    ]


def _first(out_dir: str, key: str) -> bool:
    """True for exactly one process ever per key (the file is created atomically): the victim
    dies once, and its replacement, started with the same arguments, lives."""
    try:
        os.close(
            os.open(os.path.join(out_dir, f"died-{key}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        )
    except FileExistsError:
        return False
    return True


def _worker(out_dir: str, controls: int, kills: int) -> int:
    """One trainer or generator: every key's transfer through the control plane, one JSON line
    per event. Between control keys it waits for the epoch to move (the parent restarts it)."""
    warnings.filterwarnings("ignore")
    import torch

    from ...agent import Agent
    from ...agent.refit import (
        RefitError,
        RefitStore,
        drain_released,
        empty_shards,
        local_shards,
        local_view,
        open_world,
    )
    from ...wire.refit import digest
    from .worker import RefitEpochMoved, RefitRefused, TransferFailed

    agent = Agent(heartbeat_interval_s=0.25, backend="gloo").start()
    side = "publisher" if agent.group == "train" else "subscriber"
    slot = agent.rank
    view = agent.wait_for_view(timeout=300)
    if not view.is_active(agent.rank):  # a replacement
        agent.wait_for_state("HEALTHY", timeout=60)
        agent.activate_ranks([agent.rank], wait_s=60)
    plan = _plan(CTL_ROWS, CTL_COLS)
    layout = plan.layout(side)
    shapes = {p.name: p.shape for p in plan.publisher.params}
    if side == "publisher":
        tensors = local_shards({n: _full(n, s) for n, s in shapes.items()}, plan, side, slot)
        want = {}
    else:
        tensors = empty_shards(plan, side, slot)
        want = {n: local_view(_full(n, shapes[n]), layout, n, slot) for n in tensors}
    client = agent.refit(REFIT)
    tracker = client.tracker
    store = RefitStore() if (side, slot) == ("publisher", 0) else None
    world, world_epoch, last = None, None, None
    keys = [f"control-{k}" for k in range(controls)] + [f"recovery-{k}" for k in range(kills)]
    starter = ThreadPoolExecutor(1, thread_name_prefix="transfer-start")

    def started(admitted: Any, key: str) -> tuple[Any, float]:
        t = client.transfer(admitted, key)
        return t, time.time()

    for key in keys:
        if key.startswith("control-") and last is not None:
            tracker.wait(
                lambda last=last: True if tracker.epochs[REFIT].epoch > last else None,
                300,
                "the refit's next epoch",
            )
        held = tracker.epochs.get(REFIT)
        if world is not None and held is not None and held.epoch != world_epoch:
            world.close()  # the epoch moved: its world is of no further use
        while True:
            for t in tensors.values() if side == "subscriber" else ():
                t.fill_(-1)
            make = (lambda: store.bootstrap("gloo")) if store else None
            # publisher slot 0 offers the bootstrap with its join: it comes with the admission
            admitted = client.join(slot=slot, digest=digest(plan), timeout=300, make_bootstrap=make)
            joined_at = time.time()
            held = tracker.epochs[REFIT]
            if held.epoch != admitted.epoch:
                continue
            admitted_offset = held.offset
            # The transfer starts (an event through the log) while the world forms.
            starting = starter.submit(started, admitted, key)
            try:
                boot = client.bootstrap(admitted, make=make)
                bootstrap_at = time.time()
            except RefitEpochMoved:
                continue
            opening: BaseException | None = None
            try:
                if world is None or world.closed or world_epoch != admitted.epoch:
                    if world is not None:
                        world.close()
                    world = open_world(plan, side, slot, boot, admitted.lanes, timeout_s=60)
                    world_epoch = admitted.epoch
            except (RefitError, RefitRefused) as exc:
                opening = exc
            opened_at = time.time()
            try:
                t, transfer_at = starting.result()
            except RefitEpochMoved:
                continue
            if t.status == "completed":
                emit(event="skipped", key=key, side=side, slot=slot)
                break
            try:
                if opening is not None:
                    raise opening
                if (
                    key.startswith("recovery-")
                    and side == "subscriber"
                    and slot == _victim(int(key.split("-")[1]))
                    and _first(out_dir, key)
                ):
                    emit(event="dying", key=key, slot=slot, t=time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                report = world.transfer(tensors)
                client.report(t, ok=True)
                outcome = client.wait_transfer(t, timeout=120)
            except (RefitError, RefitRefused) as exc:
                emit(event="attempt_failed", key=key, side=side, slot=slot, t=time.time(),
                      attempt=t.attempt, why=str(exc)[:300])  # fmt: skip
                if not isinstance(exc, (RefitEpochMoved, TransferFailed)):
                    with contextlib.suppress(RefitRefused):  # already failed, or moved on
                        client.report(t, ok=False, detail=str(exc))
                continue
            emit(
                event="transferred",
                key=key,
                side=side,
                slot=slot,
                attempt=t.attempt,
                epoch=admitted.epoch,
                admitted_offset=admitted_offset,
                completed_offset=outcome.offset,
                joined_at=joined_at,
                bootstrap_at=bootstrap_at,
                transfer_at=transfer_at,
                opened_at=opened_at,
                first_posted_at=report.first_posted_at,
                identical=all(torch.equal(tensors[n], w) for n, w in want.items()),
            )
            last = admitted.epoch
            break
    if world is not None:
        world.close()
    starter.shutdown()
    drain_released(10)
    agent.close()
    return 0


def run(quick: bool) -> list[Result]:
    results: list[Result] = []
    for measure in (_measure_transfer, _measure_control):
        results.extend(measure(quick))
    return results


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        raise SystemExit(f"usage: {sys.argv[0]} worker OUT CONTROLS KILLS")
    group = os.environ.get("FOLDPLANE_GROUP")
    emit(event="spawned", side="subscriber" if group == "gen" else "publisher", t=time.time())
    raise SystemExit(_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
