"""An epoch read by real agents against a real server, for the tests that show it (the rank's
story, ``replay --plot``, the console): four in-process agents on ``ElasticSampler`` read parts
of an epoch, rank 1 is deactivated by proposal (the others take its remainder), later
activated again (it takes a share of their tails), and then, if asked, every rank reads to the
epoch's end.

The reading is driven step by step from this thread (so which positions move is decided by
what the test had the ranks read, not by a race); each step waits until the coordinator has
accepted the progress it reported.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from foldplane.agent import Agent
from foldplane.facets.epochs.worker import ElasticSampler

SIZE = 4_000
#: what each rank reads before rank 1 leaves, and what the survivors read before it is back
FIRST = {0: 300, 1: 250, 2: 200, 3: 350}
BETWEEN = 200
BATCH = 20
CALM = {
    "heartbeat_timeout_s": 60.0,
    "ack_timeout_s": 20.0,
    "admission_timeout_s": 30.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.2,
}


class EpochScenario:
    def __init__(self, url: str, group: str = "data") -> None:
        self.url, self.group = url, group
        self.http = httpx.Client(base_url=url, timeout=60)
        self.agents: list[Agent] = []
        self.samplers: list[ElasticSampler] = []

    def start(self) -> EpochScenario:
        r = self.http.post("/groups", json={"group": self.group, "world_size": 4, **CALM})
        assert r.status_code == 201, r.text
        self.agents = [
            Agent(self.url, group=self.group, rank=r, heartbeat_interval_s=0.5).start()
            for r in range(4)
        ]
        for a in self.agents:
            a.wait_for_view(timeout=60)
        self.samplers = [ElasticSampler(SIZE, a, seed=3, lookahead=40) for a in self.agents]
        for s in self.samplers:
            s.set_epoch(0)
        return self

    def epoch(self) -> dict[str, Any]:
        r = self.http.get(f"/groups/{self.group}/epochs")
        assert r.status_code == 200, r.text
        return r.json()

    def read(self, counts: dict[int, int]) -> None:
        """Each rank of ``counts`` reads that many positions, batch by batch, marking each
        processed; then wait until the coordinator accepted all of it."""
        want = {r: self.samplers[r].processed + n for r, n in counts.items()}
        for rank, n in counts.items():
            sampler = self.samplers[rank]
            it = iter(sampler)
            while n > 0:
                k = min(BATCH, n)
                for _ in range(k):
                    next(it)
                sampler.mark_processed(k)
                n -= k
        for rank, n in want.items():
            tracker = self.samplers[rank].tracker
            accepted = tracker.wait(lambda t=tracker, n=n: t.accepted.get(0, 0) >= n, 60)
            assert accepted, f"rank {rank}: the coordinator never accepted {n} processed"

    def propose(self, op: str, ranks: list[int]) -> dict[str, Any]:
        r = self.http.post(
            "/proposals",
            params={"wait": 30},
            json={"group": self.group, "op": op, "ranks": ranks, "proposer": "scheduler"},
        )
        assert r.status_code in (200, 201, 202) and r.json()["status"] == "applied", r.text
        return r.json()

    def wait_version(self, version: int, ranks: list[int], timeout: float = 30) -> None:
        """Until ``ranks``' agents know their parts of ``version``'s decision."""
        deadline = time.monotonic() + timeout
        for r in ranks:  # each agent's own wait wakes when its view arrives (no polling)
            self.agents[r].wait_for_view(version, max(0.0, deadline - time.monotonic()))

    def leave_and_return(self) -> None:
        """The story: every rank reads a part; rank 1 leaves; the survivors read on; it
        returns and takes a share of what is left."""
        self.read(FIRST)
        self.leave_and_return_after_reading()

    def leave_and_return_after_reading(self) -> None:
        self.propose("deactivate", [1])
        self.wait_version(2, [0, 2, 3])
        self.read({0: BETWEEN, 2: BETWEEN, 3: BETWEEN})
        self.propose("activate", [1])
        self.wait_version(3, [0, 1, 2, 3])

    def finish(self) -> None:
        """Every rank reads what it holds, pass after pass, to the epoch's end."""

        def read_all(sampler: ElasticSampler) -> None:
            while sampler.next_pass():
                pending = 0
                for _ in sampler:
                    pending += 1
                    if pending == BATCH:
                        sampler.mark_processed(pending)
                        pending = 0
                sampler.mark_processed(pending)

        threads = [threading.Thread(target=read_all, args=(s,)) for s in self.samplers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert self.epoch()["status"] == "complete"

    def close(self) -> None:
        for a in self.agents:
            a.close()
        self.http.close()
