"""Snapshots, replay and the host contract: offsets in order, deadlines across groups."""

from __future__ import annotations

import json

import msgspec
import pytest

from foldplane.coordinator.fold.effects import Refused, ViewCommitted
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.eventlog.record import Record
from tests.fold.script import T0, S, Script, one


def test_a_restored_snapshot_continues_exactly_like_the_original():
    s = Script()
    s.form(world_size=4, max_failure=3)
    s.at(1).links(0, hint=[3])
    s.propose("deactivate", [2], idempotency_key="k")
    restored = Coordinator.from_snapshot(json.loads(json.dumps(s.m.snapshot())))
    assert restored.offset == s.m.offset
    assert restored.group_status("g") == s.m.group_status("g")
    assert restored.next_deadline() == s.m.next_deadline()
    twin = Script(restored)
    twin.incarnations = dict(s.incarnations)
    twin.now = s.now
    for script in (s, twin):
        script.at(2).tick()
        script.ack_all()
        script.at(3).death(1)
    assert msgspec.json.encode(restored.snapshot()) == msgspec.json.encode(s.m.snapshot())
    assert restored.proposal_by_key("g", "k") == s.m.proposal_by_key("g", "k")


def test_replaying_the_log_gives_byte_identical_effects():
    s = Script()
    effects = s.form(world_size=3)
    effects += s.at(1).death(2)
    effects += s.ack_all()
    replayed = Coordinator()
    again = [e for rec in s.records for e in replayed.step(rec)]
    assert msgspec.json.encode(again) == msgspec.json.encode(effects)


def test_an_unknown_snapshot_format_is_refused():
    with pytest.raises(ValueError, match="snapshot format 99"):
        Coordinator.from_snapshot({"format": 99})


def test_records_must_come_in_offset_order():
    s = Script()
    s.create(world_size=2)
    stale = Record(
        offset=1, ts=T0, term=1, kind="tick", group=None, rank=None, payload={}, checksum=0
    )
    with pytest.raises(ValueError, match="offset 1 is not after the fold's offset 1"):
        s.m.step(stale)


def test_time_never_runs_backwards():
    """A record stamped earlier than the last one (two writers' clocks) is folded at the later time."""
    s = Script()
    s.form(world_size=2)
    s.at(9).beat(0)
    s.at(4).beat(1)  # stamped in the past: counts as a beat at 9 s
    assert s.m.group_status("g")["ranks"][1]["last_heartbeat_ts"] == T0 + 9 * S


def test_next_deadline_is_the_earliest_over_groups():
    s = Script()
    s.form("a", world_size=2, heartbeat_timeout_s=30)
    s.form("b", world_size=2, heartbeat_timeout_s=5)
    assert s.m.next_deadline() == T0 + 5 * S
    effects = s.at(5).tick()
    assert {(e.group, e.rank) for e in effects if e.type == "rank_state"} == {("b", 0), ("b", 1)}
    assert s.m.group_status("a")["ranks"][0]["state"] == "HEALTHY"


def test_a_malformed_ack_is_refused_not_misread():
    s = Script()
    s.form(world_size=2)
    s.propose("deactivate", [1])
    refused = one(s.record("ack", "g", 0, {"incarnation": "g-0-a", "version": None}), Refused)
    assert refused.code == "invalid_event" and "version" in refused.message
    assert one(s.ack_all(), ViewCommitted).view.version == 2
