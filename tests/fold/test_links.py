"""Link evidence, the reconciliation window, the Healthy Set in the fold, and both modes of
``auto_deactivate_on_failure``."""

from __future__ import annotations

import json

from foldplane.coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    SYNCED,
    RankState,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.machine import Coordinator
from tests.fold.script import T0, S, Script, of, one


def healthy(s: Script) -> list[int]:
    return s.m.group_status("g")["healthy_set"]


def test_partition_012_against_34_keeps_the_larger_side():
    s = Script()
    s.form(world_size=5)
    s.at(1)
    for r in (0, 1, 2):
        s.links(r, down=(3, 4))
    for r in (3, 4):
        s.links(r, down=(0, 1, 2))
    assert healthy(s) == [0, 1, 2, 3, 4]  # the window is still open: nothing decided yet
    effects = s.at(1.25).tick()
    assert healthy(s) == [0, 1, 2]
    assert {(c.rank, c.state) for c in of(effects, RankState)} == {(3, SYNCED), (4, SYNCED)}
    left = [c for c in of(effects, RankState) if c.rank == 3][0]
    assert "links down to [0, 1, 2]" in left.reason
    prep = one(effects, ViewPrepare)
    assert prep.active_ranks == (0, 1, 2) and prep.cause["kind"] == "auto_deactivation"
    assert prep.participants == (0, 1, 2, 3, 4)  # the online ranks of the old or new view
    assert "3 SYNCED" in prep.cause["detail"]


def test_two_two_split_keeps_the_lexicographically_smallest_side():
    s = Script()
    s.form(world_size=4)
    s.at(1).links(0, down=(2, 3))
    s.links(3, down=(0, 1))
    s.at(2).tick()
    assert healthy(s) == [0, 1]


def test_two_two_split_prefers_the_side_that_is_healthy_now():
    """Ranks 0 and 1 are only SYNCED when the split is decided; 2 and 3 are HEALTHY: the tie
    goes to the working side rather than the smaller rank numbers."""
    s = Script()
    s.create(world_size=4, min_ranks=2)
    for r in (2, 3):
        s.join(r)
        s.links(r)
    s.ack_all()
    assert healthy(s) == [2, 3]
    s.at(1)
    for r in (0, 1):
        s.join(r)
        s.links(r, down=(2, 3))
    s.at(2).tick()
    assert healthy(s) == [2, 3]
    assert s.m.group_status("g")["ranks"][0]["state"] == SYNCED


def test_down_evidence_waits_for_the_window_and_hints_from_several_ranks_are_decided_together():
    s = Script()
    s.form(world_size=4, reconcile_window_s=0.5)
    assert s.at(1).links(0, hint=[3]) == []
    assert s.m.next_deadline() == T0 + round(1.5 * S)
    assert s.at(1.2).links(1, hint=[3]) == []  # the window does not move
    assert s.m.next_deadline() == T0 + round(1.5 * S)
    assert s.at(1.49).tick() == []
    effects = s.at(1.5).tick()
    assert [(c.rank, c.state) for c in of(effects, RankState)] == [(3, SYNCED)]
    assert one(effects, ViewPrepare).active_ranks == (0, 1, 2)


def test_up_evidence_applies_at_once_when_no_window_is_open():
    s = Script()
    s.form(world_size=3)
    s.at(1).links(0, down=(2,))
    s.at(2).tick()
    s.ack_all()
    assert healthy(s) == [0, 1]
    effects = s.at(3).links(0)  # 0 now says every link is up
    assert [(c.rank, c.state) for c in of(effects, RankState)] == [(2, HEALTHY)]


def test_a_window_of_zero_decides_at_once():
    s = Script()
    s.form(world_size=3, reconcile_window_s=0)
    effects = s.at(1).links(0, down=(2,))
    assert [(c.rank, c.state) for c in of(effects, RankState)] == [(2, SYNCED)]


def test_not_self_ready_leaves_the_healthy_set():
    s = Script()
    s.form(world_size=3)
    s.at(1).links(1, ready=False)
    effects = s.at(2).tick()
    change = one(effects, RankState)
    assert (change.rank, change.state) == (1, SYNCED) and "not self-ready" in change.reason


def test_auto_deactivation_off_records_the_hint_and_keeps_active_ranks():
    s = Script()
    s.form(world_size=4, auto_deactivate_on_failure=False)
    s.at(1).links(0, hint=[3])
    effects = s.at(2).tick()
    assert [(c.rank, c.state) for c in of(effects, RankState)] == [(3, SYNCED)]
    assert of(effects, ViewPrepare) == []
    status = s.m.group_status("g")
    assert status["ranks"][0]["down_peers"] == [3]
    assert status["view"]["active_ranks"] == [0, 1, 2, 3]
    assert status["change_in_flight"] is None
    # a death is recorded as a state too, and still does not touch active_ranks
    s.death(2)
    assert s.m.current_view("g").active_ranks == (0, 1, 2, 3)
    assert s.m.group_status("g")["ranks"][2]["state"] == OFFLINE


def test_auto_deactivation_on_removes_the_rank_through_the_barrier():
    s = Script()
    s.form(world_size=4)
    s.at(1).links(0, hint=[3])
    prep = one(s.at(2).tick(), ViewPrepare)
    assert (prep.version, prep.active_ranks) == (2, (0, 1, 2))
    committed = one(s.ack_all(), ViewCommitted).view
    assert committed.active_ranks == (0, 1, 2) and committed.cause["kind"] == "auto_deactivation"
    assert committed.rank_states[3] == SYNCED


def test_auto_deactivation_never_preempts_the_change_in_flight():
    s = Script()
    s.form(world_size=4)
    s.at(1).death(3)
    first = s.m.group_status("g")["change_in_flight"]
    assert first["version"] == 2 and first["active_ranks"] == [0, 1, 2]
    s.links(0, hint=[2])  # while version 2 is in flight, rank 2 leaves the Healthy Set
    effects = s.at(1.5).tick()
    assert [(c.rank, c.state) for c in of(effects, RankState)] == [(2, SYNCED)]
    assert of(effects, ViewPrepare) == []
    assert s.m.group_status("g")["change_in_flight"]["version"] == 2
    effects = s.ack_all()  # rank 2 is still online and a participant: it ACKs
    assert one(effects, ViewCommitted).view.active_ranks == (0, 1, 2)
    prep = one(effects, ViewPrepare)
    assert (prep.version, prep.active_ranks) == (3, (0, 1))


# -- a report about a view older than the peer's current process --------------------------------


def _report(s: Script, rank: int, version: int, down: list[int]) -> list:
    """A protocol-2 links report of ``rank``: ``down`` found (and hinted) on view ``version``."""
    payload = {"incarnation": s.inc(rank), "self_ready": True, "version": version}
    if down:
        payload |= {"down": down, "hint": down}
    return s.record("links", "g", rank, payload)


def _replaced(s: Script) -> None:
    """Rank 2 of a formed group of 4 dies (view 2 without it); its replacement joins, is
    activated, and view 3 holds every rank again."""
    s.at(1).death(2)
    s.ack_all()
    s.at(2).join(2, incarnation="g-2-b")
    _report(s, 2, 0, [])  # self-ready
    s.propose("activate", [2])
    s.ack_all()
    assert s.m.current_view("g").version == 3
    assert s.m.current_view("g").active_ranks == (0, 1, 2, 3)


def test_a_late_report_about_a_view_before_a_replacement_joined_does_not_count_against_it():
    """Rank 0's operation on view 1 (with rank 2's old process) fails at the collective
    timeout, after the replacement joined and view 3 activated it: that evidence is about the
    dead process; the replacement stays HEALTHY and active."""
    s = Script()
    s.form(world_size=4)
    _replaced(s)
    assert _report(s.at(5), 0, 1, [2]) == []
    assert s.at(6).tick() == []
    assert healthy(s) == [0, 1, 2, 3]
    assert s.m.group_status("g")["ranks"][0]["down_peers"] == []
    assert s.m.current_view("g").version == 3


def test_twin_the_same_report_about_a_view_the_replacement_took_part_in_counts():
    s = Script()
    s.form(world_size=4)
    _replaced(s)
    _report(s.at(5), 0, 3, [2])
    effects = s.at(6).tick()
    assert healthy(s) == [0, 1, 3]
    assert one(effects, ViewPrepare).active_ranks == (0, 1, 3)


def test_twin_a_report_that_names_no_view_counts_as_before():
    """A report without ``version`` (an agent that does not say) is taken as current."""
    s = Script()
    s.form(world_size=4)
    _replaced(s)
    s.at(5).links(0, down=(2,))
    s.at(6).tick()
    assert healthy(s) == [0, 1, 3]


def test_a_report_about_an_old_view_still_names_the_peers_whose_process_was_in_it():
    """Only the replaced rank is exempt: rank 3's process was in view 1 and still is."""
    s = Script()
    s.form(world_size=4)
    _replaced(s)
    _report(s.at(5), 0, 1, [2, 3])
    assert s.m.group_status("g")["ranks"][0]["down_peers"] == [3]
    s.at(6).tick()
    assert healthy(s) == [0, 1, 2]


def test_the_incarnation_s_view_survives_a_snapshot_and_an_older_format_still_restores():
    s = Script()
    s.form(world_size=4)
    _replaced(s)
    snap = json.loads(json.dumps(s.m.snapshot()))
    restored = Script(Coordinator.from_snapshot(snap))
    restored.incarnations = dict(s.incarnations)
    restored.offset, restored.now = s.offset, s.now
    _report(restored.at(5), 0, 1, [2])
    assert restored.m.group_status("g")["ranks"][0]["down_peers"] == []
    # Format 2 had no joined_version: every report counts for the incarnations it restores.
    snap["format"] = 2
    for group in snap["groups"]:
        group["ranks"] = [info[:10] for info in group["ranks"]]
    old = Script(Coordinator.from_snapshot(snap))
    old.incarnations = dict(s.incarnations)
    old.offset, old.now = s.offset, s.now
    _report(old.at(5), 0, 1, [2])
    assert old.m.group_status("g")["ranks"][0]["down_peers"] == [2]
