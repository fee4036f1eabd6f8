"""Rank states, incarnations, rank_epoch, fencing and the death chain: records in, effects out."""

from __future__ import annotations

from foldplane.coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    SYNCED,
    RankState,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from tests.fold.script import T0, S, Script, of, one


def states(s: Script, group: str = "g") -> dict[int, str]:
    return {r["rank"]: r["state"] for r in s.m.group_status(group)["ranks"]}


def test_join_makes_a_rank_synced_not_healthy():
    s = Script()
    s.create(world_size=2)
    effects = s.join(0)
    change = one(effects, RankState)
    assert (change.rank, change.state, change.rank_epoch) == (0, SYNCED, 1)
    assert "g-0-a" in change.reason
    assert states(s)[0] == SYNCED


def test_links_self_ready_makes_a_rank_healthy():
    s = Script()
    s.create(world_size=2)
    s.join(0)
    effects = s.links(0)
    assert one(effects, RankState).state == HEALTHY
    assert s.m.group_status("g")["healthy_set"] == [0]


def test_same_incarnation_joining_again_while_online_is_only_a_sign_of_life():
    s = Script()
    s.form(world_size=2)
    s.at(8)
    assert s.join(1) == []
    assert states(s)[1] == HEALTHY
    s.at(12).tick()  # rank 0 is 12 s silent, rank 1 only 4 s
    assert states(s) == {0: OFFLINE, 1: HEALTHY}


def test_heartbeat_timeout_takes_a_rank_offline_at_its_deadline():
    s = Script()
    s.form(world_size=2)
    s.at(5).beat(0)
    assert s.m.next_deadline() == T0 + 10 * S  # rank 1's last sign of life was at 0 s
    assert s.at(9.999).tick() == []
    effects = s.at(10).tick()
    lost = one(effects, RankState)
    assert (lost.rank, lost.state) == (1, OFFLINE)
    assert "heartbeat timeout" in lost.reason and str(T0 + 10 * S) in lost.reason
    assert s.m.next_deadline() is not None


def test_heartbeat_from_a_stale_incarnation_is_fenced():
    s = Script()
    s.form(world_size=2)
    s.death(1)
    s.join(1, incarnation="g-1-b")
    effects = s.beat(1, incarnation="g-1-a")
    refused = one(effects, Refused)
    assert refused.code == "stale_incarnation"
    assert (
        "g-1-b" in refused.message
        and "g-1-a" in refused.message
        and "rank_epoch 2" in refused.message
    )
    assert s.m.check("heartbeat", "g", 1, {"incarnation": "g-1-a"}).code == "stale_incarnation"
    assert s.m.check("heartbeat", "g", 1, {"incarnation": "g-1-b"}) is None


def test_every_stale_input_is_fenced_and_changes_nothing():
    s = Script()
    s.form(world_size=2)
    before = s.m.snapshot()["groups"]
    for kind, payload in [
        ("links", {"incarnation": "old", "self_ready": True}),
        ("ack", {"incarnation": "old", "version": 1}),
        ("exit", {"incarnation": "old"}),
        ("death_reported", {"incarnation": "old"}),
    ]:
        assert one(s.record(kind, "g", 0, payload), Refused).code == "stale_incarnation"
    assert s.m.snapshot()["groups"] == before


def test_new_incarnation_while_the_old_one_is_healthy_and_heartbeating_is_refused():
    s = Script()
    s.form(world_size=2)
    s.at(3).beat(1)
    effects = s.at(4).join(1, incarnation="g-1-b")
    refused = one(effects, Refused)
    assert refused.code == "rank_busy"
    assert "HEALTHY" in refused.message and "g-1-a" in refused.message
    assert str(T0 + 13 * S) in refused.message  # when it could join: the old heartbeat deadline
    assert states(s)[1] == HEALTHY
    assert s.m.group_status("g")["ranks"][1]["incarnation"] == "g-1-a"


def test_new_incarnation_after_the_old_heartbeat_deadline_replaces_it():
    """Past the deadline the old one is as good as dead, even before a tick said so."""
    s = Script()
    s.form(world_size=2)
    effects = s.at(10.5).join(1, incarnation="g-1-b")
    changes = of(effects, RankState)
    assert [(c.rank, c.state, c.rank_epoch) for c in changes[:2]] == [
        (1, OFFLINE, 1),
        (1, SYNCED, 2),
    ]
    assert "replaced" in changes[0].reason


def test_new_incarnation_of_a_synced_rank_replaces_it_and_counts_a_failure():
    s = Script()
    s.create(world_size=2)
    s.join(0)
    effects = s.join(0, incarnation="g-0-b")
    assert [(c.state, c.rank_epoch) for c in of(effects, RankState)] == [(OFFLINE, 1), (SYNCED, 2)]
    assert s.m.group_status("g")["failures"] == 1


def test_a_new_incarnation_clears_its_own_and_others_down_evidence():
    s = Script()
    s.form(world_size=3)
    s.at(1).links(0, down=(2,))
    s.links(1, down=(2,))
    s.at(1.25).tick()  # window closes: 2 is cut off
    assert states(s)[2] == SYNCED
    s.death(2)
    s.join(2, incarnation="g-2-b")
    status = s.m.group_status("g")
    assert status["ranks"][0]["down_peers"] == [] and status["ranks"][1]["down_peers"] == []
    effects = s.links(2)
    assert one(effects, RankState).state == HEALTHY


def test_death_report_goes_through_the_death_chain_like_a_timeout():
    s = Script()
    s.form(world_size=3, max_failure=2)
    effects = s.at(1).death(2, reporter="launcher")
    lost = one(effects, RankState)
    assert (lost.rank, lost.state) == (2, OFFLINE) and "launcher" in lost.reason
    prep = one(effects, ViewPrepare)  # auto-deactivation through the barrier
    assert prep.active_ranks == (0, 1) and prep.cause["kind"] == "auto_deactivation"
    assert s.m.group_status("g")["failures"] == 1
    s.at(1).ack_all()
    s.at(20).tick()  # ranks 0 and 1 time out: a second failure reaches the budget
    assert s.m.group_status("g")["failures"] == 3


def test_death_report_with_a_stale_incarnation_is_refused():
    s = Script()
    s.form(world_size=2)
    refused = one(s.death(1, incarnation="nope"), Refused)
    assert refused.code == "stale_incarnation" and "g-1-a" in refused.message


def test_clean_exit_is_offline_and_exited_but_never_a_failure():
    s = Script()
    s.form(world_size=3, max_failure=1)
    effects = s.at(1).exit(2)
    gone = one(effects, RankState)
    assert (gone.rank, gone.state, gone.reason) == (2, OFFLINE, "exited cleanly")
    assert of(effects, ShutdownWithSave) == []
    status = s.m.group_status("g")
    assert status["failures"] == 0 and status["ranks"][2]["exited"] is True
    # the exited rank leaves the view through the barrier, still without a shutdown
    effects = s.ack_all()
    assert one(effects, ViewCommitted).view.active_ranks == (0, 1)
    assert of(effects, ShutdownWithSave) == []


def test_offline_rank_is_told_to_rejoin():
    s = Script()
    s.form(world_size=2)
    s.death(1)
    refused = one(s.beat(1), Refused)
    assert refused.code == "rank_offline" and "join" in refused.message
    effects = s.join(1)  # same incarnation, in-place rejoin
    back = one(effects, RankState)
    assert (back.state, back.rank_epoch) == (SYNCED, 1) and "same incarnation" in back.reason


def test_failures_are_counted_once_per_incarnation():
    s = Script()
    s.form(world_size=3)
    s.death(2)
    s.join(2)  # the same incarnation comes back in place
    s.death(2)
    assert s.m.group_status("g")["failures"] == 1
    s.join(2, incarnation="g-2-b")
    s.death(2)
    assert s.m.group_status("g")["failures"] == 2


def test_inputs_for_unknown_groups_and_ranks_are_refused_with_clear_codes():
    s = Script()
    s.create(world_size=2)
    assert one(s.join(0, group="nope"), Refused).code == "unknown_group"
    refused = one(s.join(2), Refused)
    assert refused.code == "rank_out_of_range" and "0..1" in refused.message
    refused = one(s.record("join", "g", 0, {"incarnation": 7}), Refused)
    assert refused.code == "invalid_event" and "incarnation" in refused.message
    refused = one(s.record("links", "g", 0, {"incarnation": "x", "self_ready": "yes"}), Refused)
    assert refused.code == "invalid_event" and "self_ready" in refused.message
    refused = one(s.record("join", "g", None, {"incarnation": "x"}), Refused)
    assert refused.code == "invalid_event" and "rank" in refused.message
    assert s.m.group_status("g")["ranks"][0]["state"] == OFFLINE
