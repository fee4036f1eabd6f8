"""How the host answers the long polls a publish woke, on a real SQLite file.

A view change wakes every agent host's long poll of its group at once. While other inputs are
queued, the host spreads their answers over the next ``poll_spread`` batches, at least
``poll_release`` a batch, oldest first, so the burst that follows (the answers, then the ACKs
and next polls they bring) does not delay every heartbeat queued behind it; with nothing
queued it answers them all. Heartbeats that wait for their shared record (the default flush) are
not inputs the loop takes at once, so they hold back no answer.
"""

from __future__ import annotations

import asyncio

import pytest

from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord

GROUP = "p"
CONFIG = {"heartbeat_timeout_s": 3600.0, "reconcile_window_s": 0.0}
POLLS = 6


def rec(kind: str, rank: int, **payload) -> NewRecord:
    return NewRecord(
        kind=kind, group=GROUP, rank=rank, payload={"incarnation": f"i{rank}", **payload}
    )


def links(rank: int) -> NewRecord:
    """Every peer up (a protocol 2 report names only what is down)."""
    return rec("links", rank, self_ready=True, version=0)


async def _parked(host: Host, group: str, polls: int) -> None:
    """Until ``polls`` long polls of ``group`` wait on the journals (``journals.waiter``).
    A poll that finds nothing takes its waiter without awaiting anything first: this yields
    turns of the loop, never wall time, and fails after 1,000 of them."""
    for _ in range(1000):
        if host.journals.waiting(group) == polls:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{host.journals.waiting(group)} polls of {group} wait, not {polls}")


async def _joined(host: Host) -> int:
    created = await host.submit(
        NewRecord(kind="group_created", group=GROUP, payload={"world_size": 2, "config": CONFIG})
    )
    assert isinstance(created, Appended)
    joins = await host.submit_many([rec("join", 0), rec("join", 1)])
    assert all(isinstance(o, Appended) for o in joins), joins
    return host.applied_offset


async def _polls(host: Host, after: int) -> tuple[list[asyncio.Task], list[int]]:
    """``POLLS`` long polls (ranks 0 and 1 in turn), waiting; each notes the host's batch
    count when it is answered."""
    answered_at: list[int] = []

    async def poll(rank: int) -> list[str]:
        answer = await host.updates(GROUP, (rank,), after, timeout=30)
        answered_at.append(host.metrics.append_batches)
        return [u.type for u in answer.updates]

    tasks = [asyncio.create_task(poll(i % 2)) for i in range(POLLS)]
    await _parked(host, GROUP, POLLS)  # every poll finds nothing yet and waits
    assert not any(t.done() for t in tasks)
    return tasks, answered_at


@pytest.mark.parametrize(
    ("options", "batches"),
    [
        # at least poll_release a batch: 2, 2, 2
        ({"poll_release": 2}, [0, 0, 1, 1, 2, 2]),
        # a burst of 6 spread over poll_spread = 2 batches: 3, 3 (more than poll_release = 1)
        ({"poll_release": 1, "poll_spread": 2}, [0, 0, 0, 1, 1, 1]),
    ],
)
async def test_with_inputs_queued_woken_polls_are_answered_a_share_per_batch(
    tmp_path, options, batches
):
    # heartbeat_flush_s=0: each beat shares the record of the batch it arrives in, so the
    # beats queued here are inputs queued behind the burst like any other
    host = await Host.open(str(tmp_path / "log.db"), max_batch=2, heartbeat_flush_s=0, **options)
    try:
        after = await _joined(host)
        tasks, answered_at = await _polls(host, after)
        # the links form the group (a view_prepare for every rank); the heartbeats queued
        # behind them, each from a host of its own (an input each), come in batches of two
        queued = [host.enqueue_many([links(0), links(1)])]
        queued += [host.enqueue_many([rec("heartbeat", r % 2)]) for r in range(6)]
        outcomes = [o for answers in await asyncio.gather(*queued) for o in answers]
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
        for types in await asyncio.gather(*tasks):
            assert "view_prepare" in types
        first = min(answered_at)
        assert sorted(n - first for n in answered_at) == batches
    finally:
        await host.close()


async def test_with_nothing_queued_every_woken_poll_is_answered_at_once(tmp_path):
    host = await Host.open(
        str(tmp_path / "log.db"), max_batch=2, poll_release=2, heartbeat_flush_s=0
    )
    try:
        after = await _joined(host)
        tasks, answered_at = await _polls(host, after)
        outcomes = await host.submit_many([links(0), links(1)])
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
        for types in await asyncio.gather(*tasks):
            assert "view_prepare" in types
        assert len(set(answered_at)) == 1
    finally:
        await host.close()


async def test_a_poll_times_out_empty_and_leaves_no_waiter_behind(tmp_path):
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        after = await _joined(host)
        answer = await host.updates(GROUP, (0,), after, timeout=0.01)
        assert answer.updates == [] and not answer.resync
        assert answer.next_after == after
        outcomes = await host.submit_many([links(0), links(1)])
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
        assert host.journals.releasing == 0  # the expired poll was not queued for a release
        answer = await host.updates(GROUP, (0,), after, timeout=0)
        assert "view_prepare" in [u.type for u in answer.updates]
    finally:
        await host.close()


@pytest.mark.parametrize("options", [{"poll_release": 0}, {"poll_spread": 0}])
async def test_a_share_that_could_never_answer_a_poll_is_refused(tmp_path, options):
    with pytest.raises(ValueError, match="must be at least 1"):
        await Host.open(str(tmp_path / "log.db"), **options)


RANKS_PER_HOST = 8


def big(kind: str, rank: int, **payload) -> NewRecord:
    return NewRecord(
        kind=kind, group="big", rank=rank, payload={"incarnation": f"i{rank}", **payload}
    )


async def _all_appended(host: Host, records: list[NewRecord]) -> None:
    outcomes = await host.submit_many(records)
    assert all(isinstance(o, Appended) for o in outcomes), outcomes


@pytest.mark.parametrize("world", [256, 4096])
async def test_a_committed_view_reaches_every_host_at_once_while_heartbeats_wait(
    tmp_path, monkeypatch, world
):
    # Beats wait for a shared record without waking the loop. Heartbeats that arrive while the
    # commit is being appended are queued behind it; they are no reason to hold back any host's
    # push, since no batch follows until they are due. Their flush here is an hour, not the
    # default 0.5 s, so they cannot fall due inside a slow commit's turn (a loaded machine did
    # that: the polls' tasks then ran after the beats' record); a host that held pushes back
    # for them would hold them past the polls' 30 s. A tick appends them at the end.
    host = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=3600.0)
    try:
        config = {"heartbeat_timeout_s": 3600.0, "ack_timeout_s": 3600.0, "reconcile_window_s": 0.0}
        created = await host.submit(
            NewRecord(
                kind="group_created", group="big", payload={"world_size": world, "config": config}
            )
        )
        assert isinstance(created, Appended)
        ranks = range(world)
        await _all_appended(host, [big("join", r) for r in ranks])
        await _all_appended(host, [big("links", r, self_ready=True, version=0) for r in ranks])
        await _all_appended(host, [big("ack", r, version=1) for r in ranks])
        assert host.machine.current_view("big").version == 1

        victim = world - 1
        await _all_appended(host, [big("death_reported", victim)])
        survivors = [r for r in ranks if r != victim]
        hosts = [survivors[i : i + RANKS_PER_HOST] for i in range(0, world, RANKS_PER_HOST)]
        after = host.applied_offset  # the prepare of view 2 is there already

        # Every host waits for what comes after the prepare, as a host channel does; each
        # notes where the loop stood when its answer came.
        seen: list[tuple[list[str], int, bool]] = []
        beats: list[asyncio.Future] = []

        async def wait_for_commit(its: list[int]) -> None:
            answer = await host.updates("big", its, after, timeout=30)
            types = [u.type for u in answer.updates]
            seen.append((types, host.applied_offset, any(f.done() for f in beats)))

        polls = [asyncio.create_task(wait_for_commit(its)) for its in hosts]
        await _parked(host, "big", len(polls))
        assert not any(p.done() for p in polls)

        # While the ACKs' batch is appended, a heartbeat of every host arrives (each host
        # beats once a second; the commit's append is where they land).
        append_sealed = host.log.append_sealed

        async def append_while_hosts_beat(records):
            if not beats:
                beats.extend(
                    host.enqueue_many([big("heartbeat", r) for r in its]) for its in hosts[:64]
                )
            return await append_sealed(records)

        monkeypatch.setattr(host.log, "append_sealed", append_while_hosts_beat)
        await _all_appended(host, [big("ack", r, version=2) for r in survivors])
        commit = host.applied_offset
        assert host.machine.current_view("big").version == 2
        await asyncio.gather(*polls)
        assert len(seen) == len(hosts)
        for types, applied, beats_answered in seen:
            assert "view_committed" in types
            # answered in the commit's own turn: before the beats' shared record, not a
            # flush (or several) later
            assert (applied, beats_answered) == (commit, False)
        assert not any(f.done() for f in beats)  # still waiting for their shared record
        # the host's tick flushes every waiting beat ahead of it
        tick = await host.submit(NewRecord(kind="tick", group=None, payload={}))
        assert isinstance(tick, Appended)
        outcomes = [o for b in await asyncio.gather(*beats) for o in b]
        assert all(isinstance(o, Appended) and commit < o.offset < tick.offset for o in outcomes)
    finally:
        await host.close()
