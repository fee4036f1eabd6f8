"""The ACK barrier: participants, fenced ACKs, the ACK deadline, dropped ranks."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    OFFLINE,
    ProposalResolved,
    RankState,
    Refused,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import T0, S, Script, of, one


def test_a_withheld_ack_drops_the_rank_offline_at_the_ack_deadline():
    s = Script()
    s.form(world_size=4, ack_timeout_s=20, heartbeat_timeout_s=60)
    s.at(1).propose("deactivate", [0])
    pid = s.offset
    prep = s.m.group_status("g")["change_in_flight"]
    assert prep["participants"] == [0, 1, 2, 3] and prep["ack_deadline_ts"] == T0 + 21 * S
    for r in (0, 1, 3):
        s.ack(r, 2)
    assert s.m.next_deadline() == T0 + 21 * S
    assert s.at(20.9).tick() == []
    effects = s.at(21).tick()
    lost = one(effects, RankState)
    assert (lost.rank, lost.state) == (2, OFFLINE)
    assert "did not ACK version 2" in lost.reason and str(T0 + 21 * S) in lost.reason
    view = one(effects, ViewCommitted).view
    assert view.active_ranks == (1, 3) and view.dropped_ranks == (2,)
    assert view.acked_ranks == (0, 1, 3) and view.rank_states[2] == OFFLINE
    p = one(effects, ProposalResolved).proposal
    assert (p.id, p.status, p.dropped_ranks, p.version) == (
        pid,
        "applied_with_dropped_ranks",
        (2,),
        2,
    )
    assert "dropped ranks [2]" in p.reason
    assert s.m.group_status("g")["failures"] == 1


def test_a_participant_lost_mid_change_is_dropped_at_once():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [0])
    s.ack(0, 2)
    s.ack(1, 2)
    s.ack(3, 2)
    effects = s.at(2).death(2)
    view = one(effects, ViewCommitted).view
    assert view.dropped_ranks == (2,) and view.active_ranks == (1, 3)


def test_an_ack_for_another_version_is_fenced():
    s = Script()
    s.form(world_size=3)
    refused = one(s.ack(0, 2), Refused)
    assert refused.code == "stale_version" and "no view change is in flight" in refused.message
    s.propose("deactivate", [2])
    refused = one(s.ack(0, 1), Refused)
    assert refused.code == "stale_version"
    assert (
        "ACK for version 1" in refused.message and "version 2 is being prepared" in refused.message
    )
    assert s.m.group_status("g")["change_in_flight"]["acked"] == []


def test_an_ack_from_a_non_participant_is_fenced():
    s = Script()
    s.form(world_size=4)
    s.death(3)
    s.ack_all()
    s.join(3, incarnation="g-3-b")  # online again but not active, so not a participant
    s.propose("deactivate", [2])
    refused = one(s.ack(3, 3), Refused)
    assert refused.code == "stale_version" and "not a participant of version 3" in refused.message


def test_a_repeated_ack_changes_nothing():
    s = Script()
    s.form(world_size=3)
    s.propose("deactivate", [2])
    s.ack(0, 2)
    assert s.ack(0, 2) == []
    assert s.m.group_status("g")["change_in_flight"]["acked"] == [0]


def test_participants_are_the_online_ranks_of_the_old_or_new_view():
    s = Script()
    s.form(world_size=4)
    s.at(1).death(3)
    prep = s.m.group_status("g")["change_in_flight"]
    assert prep["participants"] == [0, 1, 2]
    s.ack_all()
    s.join(3, incarnation="g-3-b")
    effects = s.links(3)
    assert of(effects, ViewPrepare) == []
    s.propose("activate", [3])
    assert s.m.group_status("g")["change_in_flight"]["participants"] == [0, 1, 2, 3]


def test_one_change_in_flight_at_a_time():
    s = Script()
    s.form(world_size=4)
    s.propose("deactivate", [3])
    effects = s.propose("deactivate", [2])
    assert of(effects, ViewPrepare) == []
    assert s.m.group_status("g")["change_in_flight"]["version"] == 2
    assert len(s.m.group_status("g")["pending_proposals"]) == 1
