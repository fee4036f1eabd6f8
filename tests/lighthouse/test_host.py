"""The lighthouse's host part (``facets/lighthouse/host.py``) on a real host over a SQLite log, in
process, without gRPC: how quorum requests reach the log.

The requests of a fast quorum's members share one append (one fsync per quorum): a request
waits for the other members of the last quorum that still heartbeat, at most a tick of the rule; a
request that no fast quorum waits with is appended at once; a launcher's death report lets
the waiting requests go with it. Each answer still comes only from the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from foldplane.coordinator.host.loop import Host
from foldplane.eventlog import NewRecord
from foldplane.facets.lighthouse.effects import Settings
from foldplane.facets.lighthouse.host import LighthouseHost, LighthouseRefused
from foldplane.facets.lighthouse.messages import Quorum, QuorumMember

SETTINGS = Settings(min_replicas=2, join_timeout_ms=60_000, heartbeat_timeout_ms=5_000)


#: the rule's settings under which a waiting request waits for the rest of the last quorum for
#: longer than any test runs (one tick of an hour, and no timeout within it)
PATIENT = Settings(
    min_replicas=2,
    join_timeout_ms=3_600_000,
    quorum_tick_ms=3_600_000,
    heartbeat_timeout_ms=3_600_000,
)


async def serve(path: Path, settings: Settings) -> LighthouseHost:
    host = await Host.open(str(path))
    served = LighthouseHost(host, settings, flush_s=0.01)
    await served._configure()  # the settings in the log: a call's first step is its request
    return served


@pytest.fixture
async def lighthouse(tmp_path: Path) -> AsyncIterator[LighthouseHost]:
    served = await serve(tmp_path / "log.db", SETTINGS)
    yield served
    await served.close()
    await served.host.close()


@pytest.fixture
async def patient(tmp_path: Path) -> AsyncIterator[LighthouseHost]:
    served = await serve(tmp_path / "log.db", PATIENT)
    yield served
    await served.close()
    await served.host.close()


def member(replica: str, step: int) -> QuorumMember:
    return QuorumMember(replica_id=replica, step=step, world_size=1)


async def ask_together(lighthouse: LighthouseHost, step: int, *replicas: str) -> list[Quorum]:
    return list(await asyncio.gather(*(lighthouse.quorum(member(r, step), 10.0) for r in replicas)))


async def formed(lighthouse: LighthouseHost, *replicas: str) -> list[Quorum]:
    """The first quorum of ``replicas``: each heartbeats, then all ask at once."""
    await lighthouse.heartbeat(list(replicas))
    quorums = await ask_together(lighthouse, 0, *replicas)
    assert [[m.replica_id for m in q.participants] for q in quorums] == [sorted(replicas)] * len(
        replicas
    )
    return quorums


async def requests_in_log(lighthouse: LighthouseHost) -> list[tuple[int, int, str]]:
    """(offset, ts, replica id) of every quorum request the log holds."""
    records = await lighthouse.host.log.read(after=0, limit=1000)
    return [
        (r.offset, r.ts, r.payload["replica_id"]) for r in records if r.kind == "lighthouse_request"
    ]


async def in_the_log_by(lighthouse: LighthouseHost, replica: str, bound_s: float) -> bool:
    """Whether ``replica``'s request reaches the fold within ``bound_s``."""
    return await by(lighthouse, lambda: replica in lighthouse.fold.requests, bound_s)


async def by(lighthouse: LighthouseHost, done: Callable[[], bool], bound_s: float) -> bool:
    """Whether ``done()`` holds within ``bound_s`` (checked as each batch of the host is
    carried out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not done():
        if loop.time() >= deadline:
            return False
        await barrier(lighthouse)
    return True


async def barrier(lighthouse: LighthouseHost) -> None:
    """Every input the host was handed before this call is in the log when it returns (the
    host's queue is first in, first out)."""
    await lighthouse.host.submit(NewRecord(kind="tick", group=None, payload={}))


def spawn(coro: object) -> asyncio.Task[Quorum]:
    return asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]


async def started(task: asyncio.Task[Quorum], until: Callable[[], bool]) -> None:
    for _ in range(100):
        if until():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{task!r} did not get as far as asked")


async def test_the_requests_of_a_fast_quorum_share_one_append(patient: LighthouseHost) -> None:
    lighthouse = patient
    first = await formed(lighthouse, "a", "b")
    a = spawn(lighthouse.quorum(member("a", 1), 10.0))
    await started(a, lambda: bool(lighthouse._gathered))
    await barrier(lighthouse)  # a batch goes by: a's request waits for b's
    batches = lighthouse.host.metrics.append_batches
    [q] = await ask_together(lighthouse, 1, "b")
    assert (await a) == q and q.quorum_id == first[0].quorum_id
    assert [m.step for m in q.participants] == [1, 1]
    # one batch: both requests, at consecutive offsets with one timestamp
    assert lighthouse.host.metrics.append_batches == batches + 1
    *_, (off_a, ts_a, ra), (off_b, ts_b, rb) = await requests_in_log(lighthouse)
    assert (ra, rb) == ("a", "b") and off_b == off_a + 1 and ts_a == ts_b


async def test_twin_a_request_no_fast_quorum_waits_with_is_appended_at_once(
    patient: LighthouseHost,
) -> None:
    lighthouse = patient
    # no quorum yet, so no fast one: a's request goes to the log without waiting for b's
    a = spawn(lighthouse.quorum(member("a", 0), 10.0))
    await started(a, lambda: bool(lighthouse._gathered) or lighthouse.host.queue_depth > 0)
    assert lighthouse._gathered == []
    await barrier(lighthouse)
    assert "a" in lighthouse.fold.requests
    [q] = await ask_together(lighthouse, 0, "b")
    assert [m.replica_id for m in q.participants] == ["a", "b"] and (await a) == q


async def test_a_request_waits_for_the_rest_of_the_last_quorum_at_most_the_bound(
    patient: LighthouseHost,
) -> None:
    lighthouse = patient
    await formed(lighthouse, "a", "b")
    a = spawn(lighthouse.quorum(member("a", 1), 10.0))
    await started(a, lambda: bool(lighthouse._gathered))
    await barrier(lighthouse)
    assert "a" not in lighthouse.fold.requests  # waiting for b, which heartbeats
    lighthouse._append_gathered()  # what the bound's timer does
    assert await in_the_log_by(lighthouse, "a", 10.0)
    [q] = await ask_together(lighthouse, 1, "b")
    assert (await a) == q and [m.step for m in q.participants] == [1, 1]


async def test_the_bound_lets_a_waiting_request_go(lighthouse: LighthouseHost) -> None:
    await formed(lighthouse, "a", "b")
    a = spawn(lighthouse.quorum(member("a", 1), 10.0))
    await started(a, lambda: bool(lighthouse._gathered))
    assert "a" not in lighthouse.fold.requests
    # one tick is 100 ms: a 10 s bound on seeing it fails only if it never goes
    assert await in_the_log_by(lighthouse, "a", 10.0)
    a.cancel()


async def test_a_death_report_lets_the_requests_that_waited_for_it_go(
    patient: LighthouseHost,
) -> None:
    lighthouse = patient
    await formed(lighthouse, "train0:u1", "train1:u2", "train2:u3")
    asking = [spawn(lighthouse.quorum(member(r, 1), 10.0)) for r in ("train0:u1", "train1:u2")]
    await started(asking[1], lambda: len(lighthouse._gathered) == 2)
    batches = lighthouse.host.metrics.append_batches
    await lighthouse.lost("train2", "exit code -9")
    q0, q1 = [await a for a in asking]
    assert q0 == q1 and [m.replica_id for m in q0.participants] == ["train0:u1", "train1:u2"]
    # the requests and the report in one append
    assert lighthouse.host.metrics.append_batches == batches + 1


async def test_a_caller_that_goes_away_while_its_request_waits_leaves_nothing(
    patient: LighthouseHost,
) -> None:
    lighthouse = patient
    await formed(lighthouse, "a", "b")
    before = await requests_in_log(lighthouse)
    a = spawn(lighthouse.quorum(member("a", 1), 10.0))
    await started(a, lambda: bool(lighthouse._gathered))
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    assert lighthouse._gathered == []
    lighthouse._append_gathered()
    await barrier(lighthouse)
    assert await requests_in_log(lighthouse) == before
    assert "a" not in lighthouse.fold.requests


async def test_a_caller_that_goes_away_while_its_request_is_appended_withdraws_it(
    patient: LighthouseHost,
) -> None:
    lighthouse = patient
    await formed(lighthouse, "a", "b")
    a = spawn(lighthouse.quorum(member("a", 1), 10.0))
    await started(a, lambda: bool(lighthouse._gathered))
    lighthouse._append_gathered()  # on its way to the log
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    withdrawn = await by(
        lighthouse, lambda: lighthouse.host.metrics.appends["lighthouse_withdrawn"] == 1, 10.0
    )
    assert withdrawn and "a" not in lighthouse.fold.requests
    records = await lighthouse.host.log.read(after=0, limit=1000)
    [request] = [r for r in records if r.kind == "lighthouse_request"][-1:]
    [gone] = [r for r in records if r.kind == "lighthouse_withdrawn"]
    assert gone.payload == {"replica_id": "a", "request": request.offset}


async def test_a_request_before_any_settings_is_refused_at_once(tmp_path: Path) -> None:
    host = await Host.open(str(tmp_path / "log.db"))
    served = LighthouseHost(host, None)  # a leader a standby carries calls to, never configured
    try:
        with pytest.raises(LighthouseRefused, match="no settings"):
            await served.quorum(member("a", 0), 10.0)
        assert served._gathered == []
    finally:
        await served.close()
        await host.close()
