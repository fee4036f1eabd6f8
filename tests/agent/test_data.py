"""ElasticSampler against a real coordinator: in-process agents read their parts of an epoch,
report progress, and the epoch ends exactly when every position was processed once."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from torch.utils.data import DataLoader

from agent import Agent
from agent.data import ElasticSampler, EpochError
from tests.agent.conftest import Coordinator

pytestmark = pytest.mark.timeout(180)


#: Loader workers start from a fresh interpreter (forkserver), not a fork of this process: a
#: fork taken while the agents' threads hold locks can crash in the child (a segfault seen here).
FRESH_WORKERS = {"multiprocessing_context": "forkserver"}


def agents(url: str, group: str, ranks: list[int]) -> list[Agent]:
    return [Agent(url, group=group, rank=r, heartbeat_interval_s=0.2).start() for r in ranks]


def read_all(sampler: ElasticSampler, out: list[int], batch: int = 16) -> None:
    """Read the rank's part in batches, marking each processed as it is done, pass after pass
    until the epoch is complete."""
    while sampler.next_pass():
        pending: list[int] = []
        for index in sampler:
            pending.append(index)
            if len(pending) == batch:
                out.extend(pending)
                sampler.mark_processed(len(pending))
                pending = []
        out.extend(pending)
        sampler.mark_processed(len(pending))


def test_every_index_is_read_once_and_the_epoch_completes(coordinator: Coordinator) -> None:
    coordinator.create_group("data", 3)
    ranks = agents(coordinator.url, "data", [0, 1, 2])
    try:
        for a in ranks:
            a.wait_for_view(timeout=60)
        samplers = [ElasticSampler(1000, a, seed=7, lookahead=64) for a in ranks]
        read: list[list[int]] = [[], [], []]
        for s in samplers:
            s.set_epoch(0)  # the first appends the plan, the others get the same epoch
        threads = [threading.Thread(target=read_all, args=(samplers[i], read[i])) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        everything = Counter(i for part in read for i in part)
        assert sorted(everything) == list(range(1000))
        assert set(everything.values()) == {1}
        status = coordinator.client.request("GET", "/groups/data/epochs")
        assert status["status"] == "complete" and status["unprocessed"] == 0
        assert sorted(r["processed"] for r in status["ranks"]) == [333, 333, 334]
        # shuffled with the seed: not the identity order
        assert read[0] != sorted(read[0])
    finally:
        for a in ranks:
            a.close()


def test_a_dataloader_with_workers_reads_the_part(coordinator: Coordinator) -> None:
    coordinator.create_group("loader", 1)
    [a] = agents(coordinator.url, "loader", [0])
    try:
        a.wait_for_view(timeout=60)
        sampler = ElasticSampler(500, a, shuffle=False, lookahead=150)
        seen: list[int] = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            loader = DataLoader(
                list(range(500)), batch_size=24, sampler=sampler, num_workers=2, **FRESH_WORKERS
            )
            while sampler.next_pass():
                for batch in loader:
                    seen.extend(int(i) for i in batch)
                    sampler.mark_processed(len(batch))
            assert sampler.epoch_complete
        assert seen == list(range(500)) * 2
    finally:
        a.close()


def test_a_refused_plan_says_why(coordinator: Coordinator) -> None:
    coordinator.create_group("refuse", 1)
    [a] = agents(coordinator.url, "refuse", [0])
    try:
        a.wait_for_view(timeout=60)
        a.plan_epoch(epoch=3, dataset_size=10)
        with pytest.raises(EpochError, match="epoch 3 is still open"):
            a.plan_epoch(epoch=4, dataset_size=10)
        with pytest.raises(EpochError, match="dataset_size"):
            a.plan_epoch(epoch=5, dataset_size=0)
    finally:
        a.close()


def test_a_lookahead_smaller_than_the_loaders_prefetch_is_an_error_not_a_hang(
    coordinator: Coordinator,
) -> None:
    coordinator.create_group("tight", 1)
    [a] = agents(coordinator.url, "tight", [0])
    try:
        a.wait_for_view(timeout=60)
        sampler = ElasticSampler(500, a, shuffle=False, lookahead=100)
        sampler.set_epoch(0)
        # 2 workers x prefetch 2 + the batch being handed out: 5 x 24 = 120 > 100
        loader = DataLoader(
            list(range(500)), batch_size=24, sampler=sampler, num_workers=2, **FRESH_WORKERS
        )
        with pytest.raises(EpochError, match="Plan a lookahead of at least"):
            for batch in loader:
                sampler.mark_processed(len(batch))
    finally:
        a.close()
