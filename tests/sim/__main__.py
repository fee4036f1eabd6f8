"""``python -m tests.sim --seed N [--steps M] [--faults i,j,...]``: run one seed of the simulator.

``--seeds A:B`` runs seeds A to B-1 instead. A failing seed prints the invariant it broke, its
one-line reproduction and a shrunk schedule (the run cut at the failing step, and only the
faults without which it no longer fails). ``--faults`` keeps only those faults of the seed's
schedule (``none``: no fault at all); ``--trace`` prints the log of a single seed's run.
"""

from __future__ import annotations

import argparse
import sys
import time

from foldplane.coordinator.sim.world import HORIZON_STEPS, T0, S, World, describe, run_seed, setup


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", metavar="A:B", help="run seeds A..B-1")
    p.add_argument("--steps", type=int, default=HORIZON_STEPS)
    p.add_argument("--faults", help="indices of the seed's faults to keep, or 'none'")
    p.add_argument("--trace", action="store_true", help="print the schedule and the log")
    args = p.parse_args(argv)
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
