"""``python -m tests.sim --seed N [--steps M] [--faults i,j,...]``: run one seed of the simulator.

``--seeds A:B`` runs seeds A to B-1 instead; ``--digest A:B`` prints one SHA-256 of those seeds'
logs (every record's stored frame) and one of their replays (the projection rows a fresh fold
writes for each record, then its snapshot and every group's status), so a change that must
keep the log and its replay byte-identical is checked by running it before and after. A failing seed prints the invariant it broke, its
one-line reproduction and a shrunk schedule (the run cut at the failing step, and only the
faults without which it no longer fails). ``--faults`` keeps only those faults of the seed's
schedule (``none``: no fault at all); ``--trace`` prints the log of a single seed's run.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import msgspec

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.projections import rows_for
from foldplane.eventlog.record import encode_payload, frame_body
from foldplane.sim.world import HORIZON_STEPS, T0, S, World, describe, run_seed, setup


def digest(first: int, last: int, steps: int) -> tuple[str, str, int]:
    """SHA-256 of the seeds' logs and of their replays by a fresh fold, and the records' count."""
    log, replay, records = hashlib.sha256(), hashlib.sha256(), 0
    for seed in range(first, last):
        world = World(seed, steps, None).run()
        fresh = Coordinator()
        for rec in world.log:
            records += 1
            payload = encode_payload(rec.payload)
            log.update(frame_body(rec.offset, rec.ts, rec.term, rec.kind, rec.group, rec.rank, payload))
            for effect in fresh.step(rec):
                for row in rows_for(effect):
                    replay.update(msgspec.json.encode([row.kind, row.group, row.seq, row.doc]))
        replay.update(
            msgspec.json.encode([fresh.snapshot(), *map(fresh.group_status, fresh.groups())])
        )
    return log.hexdigest(), replay.hexdigest(), records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", metavar="A:B", help="run seeds A..B-1")
    p.add_argument("--steps", type=int, default=HORIZON_STEPS)
    p.add_argument("--faults", help="indices of the seed's faults to keep, or 'none'")
    p.add_argument("--trace", action="store_true", help="print the schedule and the log")
    p.add_argument("--digest", metavar="A:B", help="digest seeds A..B-1's logs and replays")
    args = p.parse_args(argv)
    if args.digest:
        first, _, last = args.digest.partition(":")
        logs, replays, records = digest(int(first), int(last), args.steps)
        print(f"seeds {first}:{last}, {records} records: log {logs}, replay {replays}")
        return 0
    keep = None
    if args.faults is not None:
        keep = set() if args.faults == "none" else {int(i) for i in args.faults.split(",")}
    if args.seeds:
        first, _, last = args.seeds.partition(":")
        t0 = time.perf_counter()
        failed = 0
        for seed in range(int(first), int(last)):
            failure = run_seed(seed, args.steps, keep)
            if failure is not None:
                failed += 1
                print(describe(failure), flush=True)
        n = int(last) - int(first)
        print(f"{n} seeds, {failed} failed, {n / (time.perf_counter() - t0):.1f} seeds/s")
        return 1 if failed else 0
    if args.trace:
        for i, fault in enumerate(setup(args.seed).faults):
            print(f"[{i}] {fault}")
        world = World(args.seed, args.steps, keep)
        try:
            world.run()
        except AssertionError as exc:
            print(f"broke {exc}")
        for rec in world.log:
            print(f"{rec.offset:5d} {(rec.ts - T0) / S:9.3f}s {rec.kind} {rec.rank} {rec.payload}")
    failure = run_seed(args.seed, args.steps, keep)
    if failure is None:
        print(f"seed {args.seed}: every invariant held for {args.steps} steps")
        return 0
    print(describe(failure))
    return 1


if __name__ == "__main__":
    sys.exit(main())
