"""Projection rows a leader writes and a standby holds (coordinator/host/rows.py), on SQLite."""

from __future__ import annotations

from foldplane.coordinator.host.rows import ProjectionRows
from foldplane.coordinator.host.snapshots import CONSUMER
from foldplane.eventlog import ProjectionRow, open_log


def row(group: str, seq: int = 0) -> dict:
    r = ProjectionRow("group", group, seq, {"group": group})
    return {(r.kind, r.group, r.seq): r}


async def test_a_leader_writes_its_rows_with_the_consumer_offset(tmp_path) -> None:
    log = await open_log(tmp_path / "log.db")
    try:
        rows = ProjectionRows(log, projected=0)
        rows.add(row("a"))
        await rows.write(3)
        assert rows.projected == 3 and rows.unwritten == {}
        assert await log.get_consumer_offset(CONSUMER) == 3
        assert await log.get_projection("group", "a", 0) is not None
    finally:
        await log.close()


async def test_a_standby_holds_its_rows_until_the_leader_wrote_them(tmp_path) -> None:
    log = await open_log(tmp_path / "log.db")
    try:
        rows = ProjectionRows(log, projected=0)
        rows.add(row("a"))
        rows.hold()  # stepping down: what was not written is held, and what comes later
        rows.add(row("b"))
        await rows.write(2)
        assert rows.unwritten == {} and set(rows.held) == {("group", "a", 0), ("group", "b", 0)}
        assert await log.get_projection("group", "a", 0) is None  # a standby writes nothing
        await rows.settle(2)  # the leader has not written them yet
        assert len(rows.held) == 2
        await log.write_projections([], consumer=CONSUMER, offset=2)  # now it has
        await rows.settle(2)
        assert rows.held == {} and rows.projected == 2
    finally:
        await log.close()


async def test_a_promoted_standby_writes_what_it_held(tmp_path) -> None:
    log = await open_log(tmp_path / "log.db")
    try:
        rows = ProjectionRows(log, projected=0)
        rows.hold()
        rows.add(row("a"))
        await rows.write_held(5)
        assert not rows.holding and rows.held == {} and rows.unwritten == {}
        assert rows.projected == 5
        assert await log.get_consumer_offset(CONSUMER) == 5
        assert await log.get_projection("group", "a", 0) is not None
    finally:
        await log.close()
