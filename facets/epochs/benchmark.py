"""Data that survives a dead rank (docs/data.md): samples lost and repeated per kill, how soon
the survivors hold the dead rank's remainder, the plan's bytes at 16,384 ranks, and the
throughput split against the equal split, all in one run. The epochs facet's benchmark, in its
folder (its plugin's ``benchmarks``: ``python -m benchmarks data``).

Rows:

- ``data samples lost per kill`` / ``data samples repeated per kill``: **foldplane**: a
  coordinator (``python -m coordinator serve`` on a SQLite file) and 4 workers under the real
  launcher, each an ``Agent`` reading its part through ``ElasticSampler`` and a ``DataLoader``
  (this module, ``python -m foldplane.facets.epochs.benchmark worker``); one worker is SIGKILLed once the
  coordinator has accepted about 30 % of the epoch. Every worker writes each batch's indices
  *before* marking it processed; afterwards the log is folded (the real fold over the real
  file) for the progress the coordinator accepted from each incarnation, and the batches
  within it are counted against the dataset (a batch the dead worker read and never reported
  is not processed: its samples are in its remainder and are read again by a survivor).
  **Baseline**: what a torchrun/torchft user has, ``torch.utils.data.DistributedSampler``:
  4 ranks in lockstep (DDP) read their shards; at the same 30 % one dies; the survivors
  restart on a world of 3 with a ``DistributedSampler(num_replicas=3)`` of the same seed and
  epoch and go on from the step count they had reached (they skip the batches a rank of the
  new world would have read in those steps), the common way to resume without a data state.
  Its samplers run in this process: the policy needs no coordination, so processes would
  only add noise (the indices are the same). ``extra`` also has the other policies a user
  picks: restarting the epoch on the new world (nothing lost, the 30 % read twice), and
  keeping the shards of 4 as torchft's own sampler does (the dead rank's rest is lost).
- ``data redistribution latency`` (ms): from the kill (the killer's clock) to the moment the
  last survivor's sampler received the assignment that holds its share of the remainder
  (``EpochTracker.on_update``, the workers' clock: one machine, ``time.time()``). Beside it,
  the recovery it is compared with, measured in the same run by ``benchmarks.recovery``'s
  own code: kill 1 of 4 -> every survivor's first all_reduce on the new view. Target: at most
  the recovery + 20 ms. ``extra.same_trial_view_ms``: in the same trials as the row, kill ->
  every survivor's agent holds the view without the dead rank (the assignment is committed
  with that view, at the same offset).
- ``data plan bytes per view change 16,384 ranks``: the data plan's part of one view change
  that removes a rank from a group of N mid-epoch, in process through the real fold and the
  host's ``ReadyBuilder``: the ``assignment`` projection row (its JSON document, as written)
  and every data agent update (``data_moves``, ``data_assignment``: its JSON, as the journals
  send it, counted once per journal it is published to: a group's update once, like the view
  update). The view update itself is not counted (``benchmarks.scale`` has it). The dataset is 65,536 positions
  a rank, enough that every survivor gets a slice of the dead rank's remainder: the worst
  case, where every rank's part changes. ``extra.growth`` has 1,024 and 4,096 ranks;
  ``extra.imagenet_sized`` the same view change over 1,281,167 positions (ImageNet-1k's
  training set), where only as many survivors as the remainder has positions get one;
  ``extra.grain_32`` the worst case's dataset handed out in grains of 32 (a batch), where
  only as many survivors as the remainder has grains get one.
- ``data epoch wall time, throughput split`` / ``..., equal split`` / ``..., ideal``: 4
  workers, one with twice the per-sample cost of the others (a sleep per batch: the shared
  cores are not what is measured), two epochs on each group; from the moment all four start
  reading an epoch to the moment the last one knows it is complete. Ideal: the dataset over
  the sum of the ranks' rates, each rate the inverse of the per-sample cost the worker
  measured on its own work. The rows are the second epoch, split by the rates the first
  measured (what every epoch of a job after its first is); ``extra.first_epoch_*`` is the
  first, where no rate is known yet: it starts equal and the fast ranks reclaim from the
  slow one's tail as they run dry. Targets: the throughput split (``reclaim`` on: its
  default) within 10 % of the ideal and at most 0.6 x the equal split, in the same run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ...benchmarks.harness import Result, lower_is_better_ratio, median
from ...benchmarks.kit.kills import time_recovery
from ...benchmarks.kit.service import Service
from ...benchmarks.kit.workers import Lines, emit, say, start_agent
from .protocol import DataAssignmentUpdate, DataMovesUpdate

WORLD = 4
KILL_AT = 0.3
#: the kill trials: an epoch of this many indices, batches of this size, this long a sample
KILL_DATASET, KILL_BATCH, KILL_COST_S = 7_200, 20, 0.0015
#: the split trials: the slow rank's per-sample cost is twice the others'
SPLIT_DATASET, SPLIT_BATCH, SPLIT_COST_S = 16_000, 32, 0.0015
SLOW_RANK = 1
#: the split trials read two epochs: the first starts equal (no rates reported yet) and
#: relies on reclaim; the second is split by the rates the first measured
SPLIT_EPOCHS = 2
#: a few batches: the window a move must leave a donor (docs/data.md: batch x (workers x
#: prefetch + 2) with no loader workers is 2 batches)
LOOKAHEAD_BATCHES = 4
SEED = 5
PLAN_SIZES = (1024, 4096, 16384)
PLAN_PER_RANK = 65_536
#: the other end: a dataset of ImageNet-1k's training set, where few survivors get a slice
IMAGENET = 1_281_167
LATENCY_SLACK_MS = 20.0


_log = say("data")


# -- the worker --------------------------------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    emit(event=event, t=time.time(), **fields)


def _worker(argv: list[str]) -> int:
    """``worker OUT SIZE BATCH COSTS SPLIT LOOKAHEAD EPOCHS``: read ``EPOCHS`` epochs through
    ElasticSampler, each batch costing ``len(batch) x COSTS[rank]`` seconds; write each batch's
    indices before marking it processed; say when each new assignment and view reached it."""
    from torch.utils.data import DataLoader

    from .worker import ElasticSampler

    out, size, batch = Path(argv[0]), int(argv[1]), int(argv[2])
    costs = [float(c) for c in argv[3].split(",")]
    split, lookahead, epochs = argv[4], int(argv[5]), int(argv[6])
    agent = start_agent(backend="gloo")
    cost = costs[agent.rank]
    tracker = agent.data
    on_update = tracker.on_update

    def observed(update: Any) -> None:
        on_update(update)  # first: the sampler holds it from now on
        if isinstance(update, DataAssignmentUpdate) or (
            isinstance(update, DataMovesUpdate) and any(m[1] == agent.rank for m in update.moves)
        ):
            _emit("assignment", rank=agent.rank, epoch=update.epoch, assignment=update.assignment)

    tracker.on_update = observed  # type: ignore[method-assign]

    def views() -> None:
        version = agent.wait_for_view(timeout=None).version
        try:
            while True:
                version = agent.wait_for_view(version + 1, timeout=None).version
                _emit("view", rank=agent.rank, version=version)
        except Exception:  # the agent stopped: the epoch is over
            return

    threading.Thread(target=views, daemon=True).start()
    sampler = ElasticSampler(size, agent, seed=SEED, split=split, lookahead=lookahead)
    loader = DataLoader(list(range(size)), batch_size=batch, sampler=sampler)
    with open(out / f"{agent.rank}-{agent.incarnation}.jsonl", "a", buffering=1) as lines:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            _emit("epoch", rank=agent.rank, epoch=epoch)
            if epoch == 0:
                sys.stdin.readline()  # every worker starts reading at once
            work_s = 0.0
            _emit("start", rank=agent.rank, epoch=epoch)
            while sampler.next_pass():
                for indices in loader:
                    got = [int(i) for i in indices]
                    t0 = time.perf_counter()
                    time.sleep(cost * len(got))  # the work a batch takes
                    work_s += time.perf_counter() - t0
                    cursor = sampler.processed + len(got)
                    lines.write(json.dumps({"cursor": cursor, "i": got}) + "\n")
                    sampler.mark_processed(len(got))
            _emit("done", rank=agent.rank, epoch=epoch, processed=sampler.processed, work_s=work_s)
    agent.close()
    return 0


# -- the foldplane trials ----------------------------------------------------------------------


class _Trial:
    """One group of 4 workers on ``service``, their events by kind."""

    def __init__(
        self,
        service: Service,
        group: str,
        size: int,
        batch: int,
        costs: list[float],
        split: str,
        epochs: int = 1,
    ) -> None:
        self.service, self.group, self.size = service, group, size
        self.out = service.dir / group
        self.out.mkdir()
        self.lines = Lines()
        service.create_group(group, WORLD)
        self.launcher = service.launch(
            [sys.executable, "-m", __name__, "worker", str(self.out), str(size), str(batch),
             ",".join(str(c) for c in costs), split, str(LOOKAHEAD_BATCHES * batch),
             str(epochs)],
            group, range(WORLD), self.lines.follow, stdin=subprocess.PIPE,
            env={"OMP_NUM_THREADS": "1"},
        )  # fmt: skip

    @property
    def seen(self) -> list[dict[str, Any]]:
        return self.lines.seen

    def until(
        self, event: str, ranks: set[int], timeout: float, epoch: int = 0
    ) -> dict[int, dict[str, Any]]:
        """The first ``event`` of each rank of ``ranks`` (from every event seen so far), of
        ``epoch`` where the event names one."""

        def got() -> dict[int, dict[str, Any]]:
            return {
                e["rank"]: e
                for e in reversed(self.seen)
                if e["event"] == event and e.get("epoch", epoch) == epoch
            }

        self.lines.wait_for(lambda: ranks <= set(got()), timeout, f"{self.group}: {event!r}")
        first = got()
        return {r: first[r] for r in ranks}

    def go(self) -> None:
        for rank in range(WORLD):
            stdin = self.launcher.worker(rank).process.stdin
            assert stdin is not None
            stdin.write(b"go\n")
            stdin.flush()

    def processed(self) -> int:
        status = self.service.client.request("GET", f"/groups/{self.group}/epochs")
        return status["dataset_size"] - status["unprocessed"]

    def stop(self) -> None:
        self.launcher.stop(grace_s=5)


def _kill_trial(service: Service, k: int) -> dict[str, Any]:
    victim = 1 + k % (WORLD - 1)
    trial = _Trial(service, f"kill{k}", KILL_DATASET, KILL_BATCH, [KILL_COST_S] * WORLD, "equal")
    try:
        trial.until("epoch", set(range(WORLD)), 300)
        trial.go()
        while trial.processed() < KILL_AT * KILL_DATASET:
            time.sleep(0.005)  # watching real processes from outside: no event to wait on
        at = trial.processed() / KILL_DATASET
        survivors = set(range(WORLD)) - {victim}

        def reassigned(line: dict[str, Any], killed_at: float) -> int | None:
            new = line["event"] == "assignment" and line["t"] > killed_at
            return line["rank"] if new else None

        recovery = time_recovery(
            trial.lines, functools.partial(trial.launcher.kill, victim), survivors, reassigned,
            300, f"{trial.group}: a new assignment for every survivor",
        )  # fmt: skip
        killed_at, latency_ms = recovery.killed_at, recovery.seconds * 1e3
        trial.until("done", survivors, 300)
        viewed: dict[int, float] = {}
        for e in trial.seen:
            if e["event"] == "view" and e["rank"] in survivors and e["t"] > killed_at:
                viewed.setdefault(e["rank"], e["t"])
        view_ms = (max(viewed.values()) - killed_at) * 1e3 if set(viewed) == survivors else None
        accepted = asyncio.run(_accepted(service.db, trial.group))
        seen, unreported = _processed_indices(trial.out, accepted)
        lost = KILL_DATASET - len(seen)
        repeated = sum(n - 1 for n in seen.values() if n > 1)
        status = service.client.request("GET", f"/groups/{trial.group}/epochs")
        if status["status"] != "complete":
            raise RuntimeError(f"{trial.group}: the epoch is {status['status']}")
        return {
            "victim": victim,
            "killed_at_fraction": round(at, 3),
            "latency_ms": latency_ms,
            "view_ms": view_ms,
            "lost": lost,
            "repeated": repeated,
            "reread": unreported.get(victim, 0),
        }
    finally:
        trial.stop()


async def _accepted(db: str, group: str) -> dict[tuple[int, str], int]:
    """(rank, incarnation) -> the highest progress the fold accepted from it: the log folded
    from its first record by the real fold."""
    from ...coordinator.fold.effects import Refused
    from ...coordinator.fold.machine import Coordinator as Fold
    from ...eventlog import open_log

    log = await open_log(db, create=False)
    fold = Fold()
    best: dict[tuple[int, str], int] = {}
    after = 0
    try:
        while page := await log.read(after, 5000):
            for rec in page:
                effects = fold.step(rec)
                if (
                    rec.kind == "progress"
                    and rec.group == group
                    and not any(isinstance(e, Refused) for e in effects)
                ):
                    key = (rec.rank, rec.payload["incarnation"])
                    best[key] = max(best.get(key, 0), rec.payload["processed"])
            after = page[-1].offset
    finally:
        await log.close()
    return best


def _processed_indices(
    out: Path, accepted: dict[tuple[int, str], int]
) -> tuple[Counter[int], dict[int, int]]:
    """Every index of a batch within the progress accepted from its incarnation; and per
    rank, how many it read and never had accepted (the samples in flight when it died)."""
    seen: Counter[int] = Counter()
    unreported: dict[int, int] = {}
    for path in out.glob("*.jsonl"):
        rank, incarnation = path.stem.split("-", 1)
        upto = accepted.get((int(rank), incarnation), 0)
        for line in path.read_text().splitlines():
            batch = json.loads(line)
            if batch["cursor"] <= upto:
                seen.update(batch["i"])
            else:
                unreported[int(rank)] = unreported.get(int(rank), 0) + len(batch["i"])
    return seen, unreported


def _split_trial(service: Service, name: str, split: str) -> list[dict[str, Any]]:
    """Two epochs on one group of 4 (the first with no rates known yet): per epoch, its wall
    time, the ideal, and how it went."""
    costs = [SPLIT_COST_S * (2 if r == SLOW_RANK else 1) for r in range(WORLD)]
    trial = _Trial(service, name, SPLIT_DATASET, SPLIT_BATCH, costs, split, SPLIT_EPOCHS)
    ranks = set(range(WORLD))
    try:
        trial.until("epoch", ranks, 300)
        trial.go()
        out = []
        for epoch in range(SPLIT_EPOCHS):
            starts = trial.until("start", ranks, 60, epoch)
            done = trial.until("done", ranks, 300, epoch)
            t0 = min(e["t"] for e in starts.values())
            # each rank's rate on its own work (samples over the seconds its batches took)
            rates = {r: e["processed"] / e["work_s"] for r, e in done.items() if e["work_s"] > 0}
            decisions = {
                e["assignment"]
                for e in trial.seen
                if e["event"] == "assignment" and e.get("epoch") == epoch
            }
            out.append(
                {
                    "wall_s": max(e["t"] for e in done.values()) - t0,
                    "ideal_s": SPLIT_DATASET / sum(rates.values()),
                    "finish_s": {r: round(e["t"] - t0, 3) for r, e in sorted(done.items())},
                    "work_s": {r: round(e["work_s"], 3) for r, e in sorted(done.items())},
                    "processed": {r: e["processed"] for r, e in sorted(done.items())},
                    "assignments": max(decisions, default=0),
                }
            )
        return out
    finally:
        trial.stop()


def _foldplane_trials(kills: int, split_trials: int) -> dict[str, Any]:
    with Service(store=True, name="data").start() as service:
        try:
            kill_runs = []
            for k in range(kills):
                kill_runs.append(_kill_trial(service, k))
                _log(f"kill {k + 1}/{kills}: {kill_runs[-1]}")
            splits: dict[str, list[dict[str, Any]]] = {"throughput": [], "equal": []}
            for k in range(split_trials):
                for split in ("throughput", "equal"):  # interleaved: the same noise for both
                    splits[split].append(_split_trial(service, f"{split}{k}", split))
                    _log(f"{split} split {k + 1}/{split_trials}: {splits[split][-1]}")
            return {"kills": kill_runs, "splits": splits}
        except Exception:
            _log(service.tails())
            raise


# -- the baseline: DistributedSampler re-seeded on the smaller world ---------------------------


def _baseline(kill_at: float) -> dict[str, int]:
    """4 ranks read their ``DistributedSampler`` shards in lockstep (DDP); every rank has
    finished ``steps`` steps, ``kill_at`` of the epoch, when rank 2 dies. What the survivors
    read next depends on the user's policy:

    - "continue" (the row): the 3 survivors make ``DistributedSampler(num_replicas=3)`` over
      the same seed and epoch and skip the batches of the steps already taken;
    - "restart": they read the new world's epoch from its start;
    - "keep" (torchft's own sampler, whose shards are fixed by the replica group's rank and
      count, not re-seeded): the survivors go on with their shards of 4, and the dead rank's
      rest is never read.
    """
    from torch.utils.data import DistributedSampler

    dataset = list(range(KILL_DATASET))
    victim = 2

    def shard(world: int, rank: int) -> list[int]:
        s = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
        s.set_epoch(0)
        return list(s)

    per_rank_steps = -(-KILL_DATASET // WORLD // KILL_BATCH)
    steps = round(kill_at * per_rank_steps)
    before: Counter[int] = Counter()
    for rank in range(WORLD):
        before.update(shard(WORLD, rank)[: steps * KILL_BATCH])
    after = {
        "continue": [shard(WORLD - 1, r)[steps * KILL_BATCH :] for r in range(WORLD - 1)],
        "restart": [shard(WORLD - 1, r) for r in range(WORLD - 1)],
        "keep": [shard(WORLD, r)[steps * KILL_BATCH :] for r in range(WORLD) if r != victim],
    }
    out: dict[str, int] = {}
    for policy, shards in after.items():
        seen = Counter(before)
        for part in shards:
            seen.update(part)
        out[f"{policy}_lost"] = KILL_DATASET - len(seen)
        out[f"{policy}_repeated"] = sum(n - 1 for n in seen.values() if n > 1)
    return out


# -- the plan's bytes, in process --------------------------------------------------------------


def _plan_bytes(n: int, dataset_size: int, grain: int = 1) -> dict[str, Any]:
    """The data plan's bytes on the view change that removes one rank of ``n``, 30 % into an
    epoch of ``dataset_size`` positions handed out in grains of ``grain`` (see the module
    docstring)."""
    from ...coordinator.fold.effects import ViewCommitted, ViewPrepare
    from ...coordinator.fold.machine import Coordinator as Fold
    from ...coordinator.host.journal import encoded
    from ...coordinator.host.ready import HostState, ReadyBuilder
    from ...eventlog.projection import encode_projection
    from ...eventlog.record import Record
    from .effects import AssignmentChanged
    from .inputs import complete_plan

    s = 1_000_000_000
    t0 = 1_764_000_000 * s
    fold = Fold()
    builder = ReadyBuilder(HostState(), {})
    offset = 0

    def step(t: int, kind: str, group: str | None, rank: int | None, payload: Any) -> list[Any]:
        nonlocal offset
        offset += 1
        rec = Record(
            offset=offset,
            ts=t,
            term=1,
            kind=kind,
            group=group,
            rank=rank,
            payload=payload,
            checksum=0,
        )
        effects = fold.step(rec)
        return effects

    def carry(effects: list[Any]) -> Any:
        return builder.ready(offset, effects, projected=0)

    effects = step(t0, "group_created", "g", None, {"world_size": n, "config": {}})
    for r in range(n):
        effects += step(t0, "join", "g", r, {"incarnation": f"i{r}"})
    for r in range(n):
        effects += step(t0, "links", "g", r, {"incarnation": f"i{r}", "peers": {}, "self_ready": True})  # fmt: skip
    for r in range(n):
        effects += step(t0, "ack", "g", r, {"incarnation": f"i{r}", "version": 1})
    carry(effects)
    carry(step(t0, "epoch_plan", "g", None, complete_plan({"epoch": 0, "dataset_size": dataset_size, "grain": grain})))  # fmt: skip
    effects = []
    epoch = fold.facet("epochs").epoch("g")
    assert epoch is not None
    for r, held in sorted(epoch.holdings.items()):
        done = held.held * 3 // 10
        payload = {"incarnation": f"i{r}", "epoch": 0, "assignment": 1, "processed": done}
        effects += step(t0, "progress", "g", r, payload)
    carry(effects)
    victim = n // 3
    t = t0 + s
    effects = step(t, "death_reported", "g", victim, {"reporter": "bench"})
    effects += step(t + s, "tick", None, None, {})
    prepare = [e for e in effects if isinstance(e, ViewPrepare)][-1]
    for p in prepare.participants:
        effects += step(t + s, "ack", "g", p, {"incarnation": f"i{p}", "version": prepare.version})
    if not any(isinstance(e, ViewCommitted) for e in effects):
        raise RuntimeError(f"{n} ranks: the view without rank {victim} did not commit")
    changed = [e for e in effects if isinstance(e, AssignmentChanged)]
    ready = carry(effects)
    rows = [row for row in ready.rows.values() if row.kind == "assignment"]
    row_bytes = sum(len(encode_projection(i, row)) for i, row in enumerate(rows))
    updates = [
        u for _, _, u in ready.updates if isinstance(u, DataAssignmentUpdate | DataMovesUpdate)
    ]
    update_bytes = sum(len(encoded(u)) for u in updates)
    return {
        "ranks": n,
        "dataset_size": dataset_size,
        "grain": grain,
        "bytes": row_bytes + update_bytes,
        "per_rank": round((row_bytes + update_bytes) / n, 1),
        "row_bytes": row_bytes,
        "update_bytes": update_bytes,
        "updates": len(updates),
        "moves": sum(len(e.moves) for e in changed),
    }


# -- the benchmark -----------------------------------------------------------------------------


def run(quick: bool) -> list[Result]:
    from ...benchmarks import recovery

    kills, split_trials, recoveries = (1, 1, 2) if quick else (5, 3, 5)
    plan = [_plan_bytes(n, n * PLAN_PER_RANK) for n in PLAN_SIZES]
    realistic = _plan_bytes(PLAN_SIZES[-1], IMAGENET)
    batched = _plan_bytes(PLAN_SIZES[-1], PLAN_SIZES[-1] * PLAN_PER_RANK, grain=32)
    for p in [*plan, realistic, batched]:
        _log(f"plan bytes: {p}")
    ours = _foldplane_trials(kills, split_trials)
    recovery_s, recovery_failed = recovery._foldplane(recoveries)
    base = _baseline(KILL_AT)
    _log(f"baseline: {base}")
    return [
        *_kill_rows(ours["kills"], base, recovery_s, recovery_failed, recoveries),
        _plan_row(plan, realistic, batched),
        *_split_rows(ours["splits"], split_trials),
    ]


def _kill_rows(
    runs: list[dict[str, Any]],
    base: dict[str, int],
    recovery_s: list[float],
    recovery_failed: list[str],
    recoveries: int,
) -> list[Result]:
    """Samples lost and repeated per kill against the baseline, and how soon the survivors
    held the dead rank's remainder against the recovery measured in the same run."""
    kills = len(runs)
    lost = [r["lost"] for r in runs]
    repeated = [r["repeated"] for r in runs]
    latency = [r["latency_ms"] for r in runs]
    recovery_ms = median(recovery_s) * 1e3
    baseline_name = (
        "DistributedSampler re-seeded on the world of 3, continuing from the step count "
        "(in process)"
    )
    common = {
        "kills": kills,
        "dataset": KILL_DATASET,
        "batch": KILL_BATCH,
        "killed_at_fraction": [r["killed_at_fraction"] for r in runs],
        "victims": [r["victim"] for r in runs],
    }
    return [
        Result(
            "data", "data samples lost per kill", "samples", median(lost),
            baseline=baseline_name, baseline_median=base["continue_lost"],
            target="<= 0",
            extra={
                **common, "samples": lost,
                "baseline_restart_epoch_lost": base["restart_lost"],
                "baseline_keep_shards_lost": base["keep_lost"],
            },
        ),
        Result(
            "data", "data samples repeated per kill", "samples", median(repeated),
            baseline=baseline_name, baseline_median=base["continue_repeated"],
            target="<= 0",
            extra={
                **common, "samples": repeated,
                "baseline_restart_epoch_repeated": base["restart_repeated"],
                "baseline_keep_shards_repeated": base["keep_repeated"],
                "reread_after_kill": [r["reread"] for r in runs],
            },
        ),
        Result(
            "data", "data redistribution latency", "ms", median(latency),
            p99=max(latency), baseline="recovery: kill 1 of 4 -> first all_reduce on new view",
            baseline_median=recovery_ms,
            ratio=lower_is_better_ratio(median(latency), recovery_ms),
            target=f"<= {recovery_ms + LATENCY_SLACK_MS:.0f} ms (recovery + {LATENCY_SLACK_MS:.0f} ms)",
            extra={
                "kills": kills,
                "recoveries": recoveries,
                "same_trial_view_median_ms": round(
                    median([r["view_ms"] for r in runs if r["view_ms"] is not None] or [0.0]), 1
                ),
                "samples_ms": [round(x, 1) for x in latency],
                "same_trial_view_ms": [
                    None if r["view_ms"] is None else round(r["view_ms"], 1) for r in runs
                ],
                "recovery_samples_ms": [round(x * 1e3, 1) for x in recovery_s],
                "recovery_failed_trials": recovery_failed,
            },
        ),
    ]  # fmt: skip


def _plan_row(
    plan: list[dict[str, Any]], realistic: dict[str, Any], batched: dict[str, Any]
) -> Result:
    """The plan's bytes at the largest size, with its growth and the other datasets."""
    biggest = plan[-1]
    return Result(
        "data", f"data plan bytes per view change {biggest['ranks']:,} ranks", "B",
        biggest["bytes"], target=f"<= {64 * biggest['ranks']:,} B (64 x N)",
        extra={
            **biggest,
            "imagenet_sized": realistic,
            "grain_32": batched,
            "growth": [
                {"ranks": p["ranks"], "bytes": p["bytes"], "per_rank": p["per_rank"]}
                for p in plan
            ],
        },
    )  # fmt: skip


def _split_rows(splits: dict[str, list[list[dict[str, Any]]]], split_trials: int) -> list[Result]:
    """The epoch's wall time split by throughput, equally, and the ideal."""
    # the rows: the epoch split by the rates the first one measured (every epoch of a job
    # after its first); the first epoch (an equal start, then reclaim) is in extra
    steady, first = SPLIT_EPOCHS - 1, 0
    tp = [t[steady] for t in splits["throughput"]]
    eq = [t[steady] for t in splits["equal"]]
    tp_first = [t[first] for t in splits["throughput"]]
    eq_first = [t[first] for t in splits["equal"]]
    tp_wall = median([t["wall_s"] for t in tp])
    eq_wall = median([t["wall_s"] for t in eq])
    ideal = median([t["ideal_s"] for t in tp + eq])
    first_tp, first_eq = (
        median([t["wall_s"] for t in tp_first]),
        median([t["wall_s"] for t in eq_first]),
    )
    first_ideal = median([t["ideal_s"] for t in tp_first + eq_first])
    split_common = {
        "trials": split_trials, "epoch": steady, "dataset": SPLIT_DATASET, "batch": SPLIT_BATCH,
        "cost_s_per_sample": SPLIT_COST_S, "slow_rank": SLOW_RANK,
        "lookahead": LOOKAHEAD_BATCHES * SPLIT_BATCH,
    }  # fmt: skip
    return [
        Result(
            "data", "data epoch wall time, throughput split", "s", tp_wall,
            baseline="equal split, same run", baseline_median=eq_wall,
            ratio=lower_is_better_ratio(tp_wall, eq_wall),
            target=f"<= {1.1 * ideal:.3g} s (1.1 x ideal) and >= 1.667x (0.6 x equal)",
            extra={
                **split_common, "samples_s": [round(t["wall_s"], 3) for t in tp],
                "vs_ideal": round(tp_wall / ideal, 3), "vs_equal": round(tp_wall / eq_wall, 3),
                "processed": [t["processed"] for t in tp],
                "work_s": [t["work_s"] for t in tp],
                "assignments": [t["assignments"] for t in tp],
                "first_epoch_s": round(first_tp, 3),
                "first_epoch_vs_ideal": round(first_tp / first_ideal, 3),
                "first_epoch_vs_equal": round(first_tp / first_eq, 3),
                "first_epoch_samples_s": [round(t["wall_s"], 3) for t in tp_first],
                "first_epoch_assignments": [t["assignments"] for t in tp_first],
            },
        ),
        Result(
            "data", "data epoch wall time, equal split", "s", eq_wall,
            extra={
                **split_common, "samples_s": [round(t["wall_s"], 3) for t in eq],
                "vs_ideal": round(eq_wall / ideal, 3),
                "first_epoch_s": round(first_eq, 3),
                "first_epoch_samples_s": [round(t["wall_s"], 3) for t in eq_first],
            },
        ),
        Result(
            "data", "data epoch wall time, ideal", "s", ideal,
            extra={
                **split_common, "samples_s": [round(t["ideal_s"], 3) for t in tp + eq],
                "first_epoch_s": round(first_ideal, 3),
            },
        ),
    ]  # fmt: skip


def _plan_bytes_only() -> int:
    """``python -m foldplane.facets.epochs.benchmark plan-bytes``: the plan-bytes measurements alone (in
    process, a minute or so at 16,384 ranks), one JSON line each, without the rest of the
    benchmark's trials; nothing is recorded."""
    sizes = [(n, n * PLAN_PER_RANK, 1) for n in PLAN_SIZES]
    sizes += [(PLAN_SIZES[-1], IMAGENET, 1), (PLAN_SIZES[-1], PLAN_SIZES[-1] * PLAN_PER_RANK, 32)]
    for n, size, grain in sizes:
        print(json.dumps(_plan_bytes(n, size, grain)), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        raise SystemExit(_worker(sys.argv[2:]))
    if sys.argv[1] == "plan-bytes":
        raise SystemExit(_plan_bytes_only())
    raise SystemExit(f"unknown mode {sys.argv[1]!r}")
