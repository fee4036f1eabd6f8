"""The deterministic simulator (``sim/``): how many seeds, and how much simulated time, a
core runs per second.

Each seed is a whole cluster (4 to 8 ranks, the real fold and ``AgentMachine``s, a lossy
network, crashes, partitions, clock steps and proposals) run for ``HORIZON_STEPS`` steps, with
every invariant checked after every step and a fresh replay of the log at the end. Times are
CPU seconds of this process (the machine is shared: waiting for a core is not the simulator's
cost). A seed that breaks an invariant is counted in ``extra``; the benchmark does not stop.

Metrics:
- sim seeds per second;
- sim simulated seconds per wall second: simulated time covered per CPU second.
"""

from __future__ import annotations

import time

from ..sim.invariants import Violation
from ..sim.world import HORIZON_STEPS, S, World
from .harness import Result, median


def _trial(first: int, count: int) -> tuple[float, float, int, int, int]:
    """CPU seconds, simulated seconds, steps, records and failures of ``count`` seeds."""
    simulated = 0.0
    steps = records = failed = 0
    t0 = time.process_time()
    for seed in range(first, first + count):
        world = World(seed, HORIZON_STEPS)
        try:
            world.run()
        except Violation:
            failed += 1
        simulated += world.now / S
        steps += world.step
        records += len(world.log)
    return time.process_time() - t0, simulated, steps, records, failed


def run(quick: bool) -> list[Result]:
    per_trial = 100 if quick else 1000
    trials = 3
    seeds_rate, sim_rate = [], []
    steps = records = failed = 0
    for i in range(trials):
        cpu, simulated, n_steps, n_records, n_failed = _trial(i * per_trial, per_trial)
        seeds_rate.append(per_trial / cpu)
        sim_rate.append(simulated / cpu)
        steps += n_steps
        records += n_records
        failed += n_failed
    seeds = per_trial * trials
    extra = {
        "seeds": seeds,
        "trials": trials,
        "steps_per_seed": HORIZON_STEPS,
        "mean_steps": round(steps / seeds, 1),
        "mean_records": round(records / seeds, 1),
        "failed_seeds": failed,
    }
    return [
        Result(
            bench="sim",
            metric="sim seeds per second",
            unit="seeds/s (CPU)",
            median=median(seeds_rate),
            extra=extra,
        ),
        Result(
            bench="sim",
            metric="sim simulated seconds per wall second",
            unit="simulated s / CPU s",
            median=median(sim_rate),
            extra={"seeds": seeds},
        ),
    ]
