"""ElasticSampler against a real coordinator: in-process agents read their parts of an epoch,
report progress, and the epoch ends exactly when every position was processed once."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from torch.utils.data import DataLoader

from foldplane.agent import Agent
from foldplane.facets.epochs.worker import ElasticSampler, EpochError
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


def read_pass(sampler: ElasticSampler, out: list[int], batch: int = 16) -> None:
    """One pass over what the rank holds, each batch marked processed as it is done."""
    assert sampler.next_pass()
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


def test_the_replacement_of_a_rank_that_finished_its_part_starts_from_what_is_unclaimed(
    coordinator: Coordinator,
) -> None:
    """Rank 2 reads its whole (small) part, the coordinator accepts it, and then its process
    dies and a new incarnation takes its place in the same view (no auto-deactivation, so no
    move tells the replacement how far its predecessor got). The replacement starts from its
    predecessor's count, not the plan's cursor: it reads nothing twice, and the epoch ends
    with every index read once."""
    coordinator.create_group("finished", 3, auto_deactivate_on_failure=False)
    ranks = agents(coordinator.url, "finished", [0, 1, 2])
    replacement = None
    try:
        for a in ranks:
            a.wait_for_view(timeout=60)
        fields = {"seed": 5, "lookahead": 32, "split": "ratios", "partition_ratios": [1, 1, 0.1]}
        samplers = [ElasticSampler(1000, a, wait_s=30, **fields) for a in ranks]
        for s in samplers:
            s.set_epoch(0)
        read: list[list[int]] = [[], [], [], []]
        read_pass(samplers[2], read[2])
        held = len(read[2])
        assert 0 < held < 100

        def rank_2() -> dict:
            status = coordinator.client.request("GET", "/groups/finished/epochs")
            return next(r for r in status["ranks"] if r["rank"] == 2)

        deadline = time.monotonic() + 30
        while rank_2()["processed"] < held:  # the report of the part's end is in flight
            assert time.monotonic() < deadline, rank_2()
            time.sleep(0.02)  # pacing the watch of a real coordinator, not a stand-in for an event
        # its process dies (a supervisor reports it) and a replacement joins
        coordinator.client.report_death("finished", 2, ranks[2].incarnation)
        replacement = agents(coordinator.url, "finished", [2])[0]
        replacement.wait_for_state("HEALTHY", timeout=60)
        after = ElasticSampler(1000, replacement, wait_s=30, **fields)
        after.set_epoch(0)
        assert after.processed == held  # its predecessor's count, not the plan's cursor
        assert len(after) == 0  # and nothing of what it processed to read again
        jobs = [(samplers[0], read[0]), (samplers[1], read[1]), (after, read[3])]
        errors: list[BaseException] = []

        def run(sampler: ElasticSampler, out: list[int]) -> None:
            try:
                read_all(sampler, out)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=job) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        everything = Counter(i for part in read for i in part)
        assert sorted(everything) == list(range(1000)) and set(everything.values()) == {1}
        assert rank_2()["processed"] == held
        assert replacement.data.error is None
    finally:
        for a in [*ranks, *([replacement] if replacement else [])]:
            a.close()
