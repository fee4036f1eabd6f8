"""A coordinator outage is not a rank failure: a Host restarted on the same SQLite file after a
gap longer than ``heartbeat_timeout_s`` appends a resumed tick and loses no rank.

The gap is injected, not slept: the group's records are appended straight to the log with
timestamps an hour in the past, as if the coordinator had been down since then.
"""

from __future__ import annotations

import time

from foldplane.coordinator.fold.effects import HEALTHY
from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord, open_log

HOUR_NS = 3_600 * 1_000_000_000


async def _formed_an_hour_ago(db: str, world_size: int) -> int:
    """Create, join, ready and ACK view 1 of group ``g``, every record an hour old."""
    then = time.time_ns() - HOUR_NS
    inc = {r: f"g-{r}-a" for r in range(world_size)}
    records = [
        NewRecord(
            kind="group_created",
            group="g",
            payload={"world_size": world_size, "config": {"heartbeat_timeout_s": 10}},
            ts=then,
        )
    ]
    for kind, extra in (("join", {}), ("links", {"self_ready": True}), ("ack", {"version": 1})):
        records += [
            NewRecord(
                kind=kind, group="g", rank=r, payload={"incarnation": inc[r], **extra}, ts=then
            )
            for r in inc
        ]
    log_ = await open_log(db)
    try:
        await log_.claim_term()
        offsets = await log_.append(records)
    finally:
        await log_.close()
    return offsets[-1]


async def test_a_restart_after_an_outage_keeps_every_rank(tmp_path):
    db = str(tmp_path / "log.db")
    head = await _formed_an_hour_ago(db, 4)
    host = await Host.open(db)
    try:
        assert host.machine.current_view("g").version == 1
        # Every rank's heartbeat deadline passed during the outage ...
        assert host.machine.next_deadline() < time.time_ns()
        # ... but the first thing the host appends is the resumed tick, before any other input.
        beat = await host.submit(
            NewRecord(kind="heartbeat", group="g", rank=0, payload={"incarnation": "g-0-a"})
        )
        assert isinstance(beat, Appended)
        [first] = await host.log.read(after=head, limit=1)
        assert (first.kind, first.payload) == ("tick", {"resumed": True})
        status = host.machine.group_status("g")
        assert [r["state"] for r in status["ranks"]] == [HEALTHY] * 4
        assert status["shutdown"] is None and status["failures"] == 0
        # The deadlines now count from the resumed tick: the ranks get a full timeout to speak.
        assert host.machine.next_deadline() == first.ts + 10 * 1_000_000_000
    finally:
        await host.close()


async def test_a_host_with_nothing_to_resume_appends_nothing(tmp_path):
    db = str(tmp_path / "log.db")
    host = await Host.open(db)
    try:
        created = await host.submit(
            NewRecord(kind="group_created", group="g", payload={"world_size": 2, "config": {}})
        )
        assert isinstance(created, Appended) and created.offset == 1
    finally:
        await host.close()
