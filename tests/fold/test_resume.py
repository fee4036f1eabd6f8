"""A coordinator outage is not a rank failure: the resumed tick restarts the deadlines that wait
on the ranks, so a restart longer than ``heartbeat_timeout_s`` loses nobody."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    OFFLINE,
    ProposalResolved,
    RankState,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import T0, S, Script, of, one


def resumed(s: Script) -> list:
    return s.record("tick", None, None, {"resumed": True})


def formed() -> Script:
    s = Script()
    s.at(0).form(world_size=4, heartbeat_timeout_s=10, ack_timeout_s=30, admission_timeout_s=30)
    for r in range(4):
        s.at(1).beat(r)
    return s


def test_without_a_resumed_tick_an_outage_loses_every_rank():
    """The twin of the next test: the first plain tick after a 60 s gap takes every rank."""
    s = formed()
    effects = s.at(60).tick()
    assert [e.state for e in of(effects, RankState)] == [OFFLINE] * 4
    assert one(effects, ShutdownWithSave).reason == "all_ranks_lost"


def test_a_resumed_tick_restarts_every_heartbeat_deadline():
    s = formed()
    assert s.m.next_deadline() == T0 + 11 * S
    effects = s.at(60).record("tick", None, None, {"resumed": True})
    assert effects == []
    assert s.m.next_deadline() == T0 + 70 * S
    assert of(s.at(60).tick(), RankState) == []
    # the ranks' own silence still counts from the resumed tick: 3 never speaks again
    for r in (0, 1, 2):
        s.at(65).beat(r)
    gone = one(s.at(70).tick(), RankState)
    assert (gone.rank, gone.state) == (3, OFFLINE)
    assert f"last sign of life at {T0 + 60 * S}" in gone.reason


def test_a_resumed_tick_restarts_the_ack_deadline_of_the_change_in_flight():
    s = formed()
    prepare = one(s.at(2).death(3), ViewPrepare)
    assert prepare.ack_deadline_ts == T0 + 32 * S
    resumed(s.at(100))
    status = s.m.group_status("g")
    assert status["change_in_flight"]["ack_deadline_ts"] == T0 + 130 * S
    assert of(s.at(100).tick(), RankState) == []
    effects = s.at(101).ack_all()
    view = one(effects, ViewCommitted).view
    assert (view.active_ranks, view.dropped_ranks) == ((0, 1, 2), ())


def test_a_resumed_tick_restarts_admission_deadlines():
    s = formed()
    s.at(2).death(3)
    s.at(3).ack_all()
    s.at(4).join(3, incarnation="g-3-b")  # SYNCED, not ready: the activation must wait
    s.at(5).propose("activate", [3])
    resumed(s.at(100))
    for r in range(4):
        s.at(101).beat(r)
    assert of(s.at(101).tick(), ProposalResolved) == []
    prepare = one(s.at(102).links(3), ViewPrepare)  # 3 ready: admitted within 100 + 30 s
    assert prepare.active_ranks == (0, 1, 2, 3)


def test_without_a_resumed_tick_the_admission_deadline_passes_during_the_outage():
    s = formed()
    s.at(2).death(3)
    s.at(3).ack_all()
    s.at(4).join(3, incarnation="g-3-b")
    s.at(5).propose("activate", [3])
    for r in range(4):
        s.at(100).beat(r)  # the ranks reach the coordinator as soon as it is back
    effects = s.at(101).tick()
    rejected = one(effects, ProposalResolved).proposal
    assert rejected.status == "rejected" and "rank 3 is SYNCED" in rejected.reason


def test_only_deadlines_that_wait_on_ranks_call_for_a_resumed_tick():
    s = Script()
    assert not s.m.waits_on_ranks()
    s.create(world_size=2, formation_timeout_s=60)
    assert s.m.next_deadline() is not None and not s.m.waits_on_ranks()  # formation only
    s.join(0)
    assert s.m.waits_on_ranks()
    effects = resumed(s.at(61))  # the formation deadline is not restarted
    assert "missing [0, 1]" in effects[0].reason
