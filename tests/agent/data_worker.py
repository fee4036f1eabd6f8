"""A worker for the epoch-plan tests: a real Agent, ``ElasticSampler`` and a ``DataLoader``.

It reads its part of one epoch and writes, per batch and *before* marking it processed, one
JSON line to ``<out>/<rank>-<incarnation>.jsonl``: ``{"cursor": c, "indices": [...]}``, where
``c`` is the rank's processed count once the batch is marked. So a SIGKILL at any moment
leaves lines for every batch this process read, and the test keeps those the coordinator
accepted as processed (its cursor for this incarnation reached ``c``).

Arguments: ``OUT DATASET_SIZE BATCH SECONDS_PER_BATCH [LOADER_WORKERS [SEED]]``. A replacement (it
starts while its rank is not active) says ``waiting`` once HEALTHY and proposes its own
activation when the test writes a line to its stdin. Events on stdout, one JSON object a
line: ``started``, ``waiting``, ``epoch`` (the plan is known), ``done``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

from foldplane.agent import Agent
from foldplane.facets.epochs.worker import ElasticSampler


def emit(event: str, **fields: object) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, **fields}) + "\n", end="", flush=True)


def main() -> int:
    out, size, batch, pace = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    loader_workers = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    seed = int(sys.argv[6]) if len(sys.argv) > 6 else 11
    agent = Agent(heartbeat_interval_s=0.25, backend="gloo")
    agent.start()
    emit("started", rank=agent.rank, incarnation=agent.incarnation)
    view = agent.wait_for_view(timeout=60)
    if not view.is_active(agent.rank):
        agent.wait_for_state("HEALTHY", timeout=60)
        emit("waiting")
        sys.stdin.readline()
        agent.activate_ranks([agent.rank], wait_s=60)
    sampler = ElasticSampler(size, agent, seed=seed, lookahead=8 * batch, grain=1)
    sampler.set_epoch(0)
    emit("epoch", epoch=0)
    loader = DataLoader(
        list(range(size)), batch_size=batch, sampler=sampler, num_workers=loader_workers
    )
    passes = 0
    with open(out / f"{agent.rank}-{agent.incarnation}.jsonl", "a", buffering=1) as lines:
        while sampler.next_pass():
            passes += 1
            for indices in loader:
                time.sleep(pace)  # the work a batch takes
                got = [int(i) for i in indices]
                cursor = sampler.processed + len(got)
                lines.write(json.dumps({"cursor": cursor, "indices": got}) + "\n")
                lines.flush()
                sampler.mark_processed(len(got))
    emit("done", processed=sampler.processed, passes=passes)
    agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
