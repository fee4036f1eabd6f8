"""Compaction keeps every decision, and a replay after it equals the projections.

A real in-process ``Host`` writes a group's life to a real SQLite file (and to PostgreSQL);
the compactor removes what retention allows; then the log is checked record by record
against a fold of the log as it was before, and replayed.
"""

from __future__ import annotations

import pytest

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.compaction import compact_log
from foldplane.coordinator.host.loop import CONSUMER, Host
from foldplane.coordinator.host.ready import HostState
from foldplane.coordinator.host.replay import CompactedLog, is_summary, replay_log
from foldplane.coordinator.host.retention import RetainPolicy, has_down_evidence, heartbeat_class
from foldplane.eventlog import Log, LogError, NewRecord, ProjectionRow, Record, open_log
from tests.retention.history import Life


async def everything(log: Log) -> list[Record]:
    out: list[Record] = []
    while page := await log.read(out[-1].offset if out else 0, 5000):
        out.extend(page)
    return out


async def projections(log: Log, group: str) -> dict[str, list]:
    return {
        kind: await log.read_projections(kind, group, limit=1000)
        for kind in ("view", "proposal", "rank_state")
    }


async def write_life(target: str) -> tuple[list[Record], dict]:
    # heartbeat_flush_s=0: each round of beats shares one record, appended at once (the
    # default flush would hold each of the life's 160 rounds half a second on the wall clock)
    host = await Host.open(target, snapshot_every=200, heartbeat_flush_s=0)
    life = Life(host)
    await life.live()
    await host.close()
    log = await open_log(target)
    try:
        return await everything(log), await replay_log(log)
    finally:
        await log.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "log.db")
    from tests.eventlog.conftest import schema_url

    pg_url = request.getfixturevalue("pg_url")
    return schema_url(pg_url, request.getfixturevalue("pg_schema"))


async def test_compaction_keeps_every_decision_and_replay_after_it_equals_the_projections(
    target: str,
) -> None:
    before, replayed = await write_life(target)
    assert replayed.ok and [v["version"] for v in replayed.views] == [1, 2, 3, 4]
    # what a fold of the whole, uncompacted log says about each record
    fold = Coordinator()
    decided = {}
    for rec in before:
        decided[rec.offset] = fold.step(rec)

    log = await open_log(target)
    try:
        stored_before = await projections(log, "train")
        report = await compact_log(log, RetainPolicy(keep_records=0), step_records=50)
        assert report.ok, report.divergences
        assert len(report.steps) >= 2  # several transactions, each behind its own snapshot
        after = await everything(log)
        kept = {r.offset for r in after}
        gone = [r for r in before if r.offset not in kept]
        assert report.removed == len(gone) > 100

        for rec in before:
            if rec.offset in kept:
                continue
            # what went is heartbeat-class, said nothing was down, and decided nothing
            assert rec.kind in heartbeat_class(), rec
            assert not has_down_evidence(rec.payload), rec
            assert all(type(e).__name__ == "Refused" for e in decided[rec.offset]), rec
            assert rec.offset <= report.region_end
        for rec in before:
            if rec.kind not in heartbeat_class() or has_down_evidence(rec.payload):
                assert rec.offset in kept, rec
            if any(type(e).__name__ != "Refused" for e in decided[rec.offset]):
                assert rec.offset in kept, rec
        # each kept record is byte-for-byte what it was
        by_offset = {r.offset: r for r in before}
        assert all(by_offset[r.offset] == r for r in after)

        # no silent hole: every missing offset lies in a removed range, and the counts add up
        ranges = await log.removed_ranges()
        assert [(r.first, r.last) for _, r in report.steps] == [(r.first, r.last) for r in ranges]
        for r in ranges:
            missing = [o for o in range(r.first, r.last + 1) if o not in kept]
            assert len(missing) == r.removed
        covered = {o for r in ranges for o in range(r.first, r.last + 1)}
        assert all(o in covered for o in by_offset if o not in kept)
        point = report.steps[-1][0]
        assert ranges[-1].last <= point
        assert all(o in kept for o in by_offset if o > point)  # after the point: gap-free

        # the projections (views, proposals) are untouched, for the whole life of the group
        assert await projections(log, "train") == stored_before

        # replay starts from the kept snapshot the retained log needs, verified, and agrees
        again = await replay_log(log)
        assert again.ok, again.divergences
        assert again.start.offset == report.steps[-1][0]
        assert any("equal what compaction verified" in v for v in again.start.verified)
        assert again.views == replayed.views  # the whole life, not only the tail
        with pytest.raises(CompactedLog, match=rf"{ranges[0].first}-{ranges[0].last}"):
            await replay_log(log, from_start=True)
        # a stop inside the compacted part cannot be folded to; the message says where one can
        with pytest.raises(CompactedLog, match=r"earliest offset a replay can stop at is \d+"):
            await replay_log(log, until=ranges[0].last - 1)
        # one whole kept state: each step shrank the one it superseded to a summary
        kept_offsets = await log.kept_snapshots(CONSUMER)
        assert kept_offsets == [at for at, _ in report.steps]
        blobs = [await log.load_kept_snapshot(CONSUMER, k) for k in kept_offsets]
        assert [is_summary(b) for b in blobs] == [True] * (len(blobs) - 1) + [False]
        assert all(len(b) < 300 for b in blobs[:-1]) and len(blobs[-1]) > 1000
        with pytest.raises(CompactedLog, match=rf"can stop at is {kept_offsets[-1]}"):
            await replay_log(log, until=kept_offsets[0])
        early = await replay_log(log, until=kept_offsets[-1])
        assert early.ok and early.start.offset == kept_offsets[-1]
        assert early.views == [v for v in replayed.views if v["offset"] <= kept_offsets[-1]]

        # a view tampered with before the start is a divergence too, named, and stops
        # a compaction before it removes anything
        true_view = (await log.get_projection("view", "train", 1)).doc
        forged = {**true_view, "active_ranks": [0, 1]}
        projected = await log.get_consumer_offset(CONSUMER)
        await log.write_projections(
            [ProjectionRow("view", "train", 1, forged)], consumer=CONSUMER, offset=projected
        )
        tampered = await replay_log(log)
        assert not tampered.ok
        assert any("train/1" in d and "compaction step" in d for d in tampered.divergences)
        refused = await compact_log(log, RetainPolicy(keep_records=0), step_records=50)
        assert not refused.ok and refused.steps == []
        await log.write_projections(
            [ProjectionRow("view", "train", 1, true_view)], consumer=CONSUMER, offset=projected
        )

        # a second run has nothing left to remove and changes nothing
        second = await compact_log(log, RetainPolicy(keep_records=0), step_records=50)
        assert second.ok and second.steps == [] and await everything(log) == after
    finally:
        await log.close()

    # a host restores from the kept snapshot and the tail to exactly the full fold's state
    log = await open_log(target)
    try:
        await log.set_consumer_offset(CONSUMER, before[-1].offset)  # (unchanged; a no-op)
        await log.save_snapshot(CONSUMER, 1, b"an unusable snapshot, older than the kept one")
        host = await Host.restore(log)
        assert host.machine.offset == before[-1].offset
        assert host.machine.snapshot() == fold.snapshot()
        offsets = await log.append([NewRecord(kind="tick", payload={})])
        assert offsets == [before[-1].offset + 1]  # offsets are never reused
        # a fold that lags behind the compaction point (a standby left behind) stops with a
        # reason instead of folding across the removed records
        behind = Host(log, Coordinator(), HostState(), projected=0)
        with pytest.raises(LogError, match="removed by compaction before this coordinator"):
            await behind.catch_up()
    finally:
        await log.close()
