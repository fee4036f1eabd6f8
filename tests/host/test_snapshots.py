"""Snapshots (coordinator/host/snapshots.py) on a real SQLite log: format, when, restore."""

from __future__ import annotations

import msgspec
import pytest

from foldplane.coordinator.host.metrics import HostMetrics
from foldplane.coordinator.host.ready import HostState, ReadyBuilder
from foldplane.coordinator.host.snapshots import (
    CONSUMER,
    SNAPSHOT_FORMAT,
    Snapshots,
    decode_snapshot,
    encode_snapshot,
    restore_state,
)
from foldplane.eventlog import open_log
from tests.fold.script import Script


def formed() -> tuple[Script, HostState]:
    script = Script()
    effects = script.form("g", 2)
    state = HostState()
    ReadyBuilder(state, {}).ready(script.offset, effects, projected=0)
    return script, state


def test_a_snapshot_decodes_to_the_fold_and_host_state_it_was_taken_of() -> None:
    script, state = formed()
    machine, restored = decode_snapshot(encode_snapshot(script.m, state))
    assert machine.snapshot() == script.m.snapshot()
    assert restored == state


def test_another_format_is_refused_naming_both() -> None:
    script, state = formed()
    doc = msgspec.json.decode(encode_snapshot(script.m, state))
    doc["format"] = SNAPSHOT_FORMAT + 1
    with pytest.raises(ValueError, match=f"snapshot format {SNAPSHOT_FORMAT + 1}, expected"):
        decode_snapshot(msgspec.json.encode(doc))


async def test_one_is_due_after_every_records_or_interval_s_with_records(tmp_path) -> None:
    log = await open_log(tmp_path / "log.db")
    now = [100.0]
    try:
        snaps = Snapshots(
            log, HostMetrics(), offset=10, every=5, interval_s=30.0, clock=lambda: now[0]
        )
        assert not snaps.due(10)
        assert not snaps.due(14)
        assert snaps.due(15)
        now[0] += 30.0
        assert snaps.due(11)  # the interval passed and a record arrived
        assert not snaps.due(10)  # nothing new: nothing to save
    finally:
        await log.close()


async def test_one_is_due_after_beats_heartbeats_whatever_few_records_carry_them(
    tmp_path,
) -> None:
    # A shared record carries a whole group's beats: three records of 4,096 beats each are
    # 12,288 beats for a restart to fold.
    log = await open_log(tmp_path / "log.db")
    now = [100.0]
    try:
        metrics = HostMetrics()
        snaps = Snapshots(log, metrics, offset=10, every=20_000, beats=10_000, clock=lambda: now[0])
        metrics.heartbeats += 2 * 4096
        assert not snaps.due(12)
        metrics.heartbeats += 4096
        assert snaps.due(13)
        script, state = formed()
        await snaps.take(script.m, state)
        assert snaps.beats_at == metrics.heartbeats  # counted afresh from here
        metrics.heartbeats += 4096
        assert not snaps.due(script.offset + 1)
        # the beats alone, with no record after the snapshot, save nothing
        metrics.heartbeats += 10_000
        assert not snaps.due(script.offset)
    finally:
        await log.close()


async def test_by_default_heartbeats_alone_bring_no_snapshot_every_30_s(tmp_path) -> None:
    # 4,096 ranks beating once a second, a shared record every 0.5 s: 30 s brought a snapshot
    # of the whole group each time, some 60 times the bytes the log grew by meanwhile.
    log = await open_log(tmp_path / "log.db")
    now = [100.0]
    try:
        metrics = HostMetrics()
        snaps = Snapshots(log, metrics, offset=10, clock=lambda: now[0])
        offset = 10
        for _ in range(60):  # 30 s
            now[0] += 0.5
            offset += 1
            metrics.heartbeats += 2048
        assert not snaps.due(offset)
        for _ in range(2 * 480):  # 8 minutes more: 2,088,960 beats in all
            now[0] += 0.5
            offset += 1
            metrics.heartbeats += 2048
        assert snaps.due(offset)
    finally:
        await log.close()


@pytest.mark.parametrize(("every", "beats"), [(0, 10), (10, 0)])
async def test_a_cadence_that_would_snapshot_every_batch_is_refused(tmp_path, every, beats):
    log = await open_log(tmp_path / "log.db")
    try:
        with pytest.raises(ValueError, match="at least 1 record and 1 heartbeat"):
            Snapshots(log, HostMetrics(), offset=0, every=every, beats=beats)
    finally:
        await log.close()


async def test_a_snapshot_is_written_beside_the_batches_then_restored(tmp_path) -> None:
    script, state = formed()
    log = await open_log(tmp_path / "log.db")
    try:
        metrics = HostMetrics()
        snaps = Snapshots(log, metrics, offset=0, every=1)
        snaps.maybe_start(script.m, state)
        assert snaps.writing is not None
        snaps.maybe_start(script.m, state)  # one at a time: no second write starts
        await snaps.settle()
        assert snaps.offset == script.offset and metrics.snapshots == 1
        saved = await log.load_snapshot(CONSUMER)
        assert saved is not None and saved[0] == script.offset
        machine, restored = await restore_state(log)
        assert machine.snapshot() == script.m.snapshot() and restored == state
        await snaps.take(script.m, state)  # at the same offset: nothing to save
        assert metrics.snapshots == 1
    finally:
        await log.close()


async def test_an_unusable_snapshot_falls_back_to_a_fold_from_scratch(tmp_path) -> None:
    log = await open_log(tmp_path / "log.db")
    try:
        await log.save_snapshot(CONSUMER, 3, b"not a snapshot")
        machine, state = await restore_state(log)
        assert machine.offset == 0 and state == HostState()
    finally:
        await log.close()
