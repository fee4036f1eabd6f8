"""A view that failed with every member alive (``coordinator.fold.stalls``): one retry with the
same members, then the evidence decides, or the group shuts down; never an endless stall.

Each member reports ``failed: v`` with how many operations it had issued and completed on view
v when the failure (a collective timeout that blamed nobody) reached it."""

from __future__ import annotations

from typing import Any

from foldplane.coordinator.fold.effects import (
    RankState,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.wire.protocol import links_event
from tests.fold.script import Script, encode, of, one

WINDOW = 0.2  # reconcile_window_s
HB = 3.0  # heartbeat_timeout_s


def failed(s: Script, rank: int, version: int, issued: int, completed: int) -> list[Any]:
    payload = {
        "incarnation": s.inc(rank),
        **links_event((), (), True, version, (issued, completed)),
    }
    return s.record("links", "g", rank, payload)


def formed(world_size: int = 4, **config: Any) -> Script:
    s = Script()
    s.at(0).form(world_size=world_size, reconcile_window_s=WINDOW, heartbeat_timeout_s=HB, **config)
    assert s.m.current_view("g").version == 1
    return s


def beat_all(s: Script, world_size: int = 4) -> None:
    for r in range(world_size):
        s.beat(r)


def at(s: Script, seconds: float) -> Script:
    """Move to ``seconds``; every rank's heartbeat arrives just then (they are all alive)."""
    s.at(seconds)
    beat_all(s)
    return s


def commit(s: Script) -> ViewCommitted:
    return one(s.ack_all(), ViewCommitted)


def test_a_view_failed_with_nobody_blamed_is_retried_with_the_same_members():
    s = formed()
    effects = failed(at(s, 10), 0, 1, 7, 6)
    assert of(effects, ViewPrepare) == []  # the window lets a real hint arrive first
    for r in (1, 2):  # rank 3's report is slow (or lost)
        assert of(failed(at(s, 10.05), r, 1, 7, 6), ViewPrepare) == []
    assert s.m.next_deadline() == s.now - round(0.05 * 1e9) + round(WINDOW * 1e9)
    prepare = one(at(s, 10.2).tick(), ViewPrepare)
    assert (prepare.version, prepare.active_ranks) == (2, (0, 1, 2, 3))
    assert prepare.cause["kind"] == "view_retry"
    assert "version 1 failed with every member alive" in prepare.cause["detail"]
    assert "0: 7/6" in prepare.cause["detail"]
    view = commit(s).view
    assert (view.version, view.active_ranks, view.cause["kind"]) == (2, (0, 1, 2, 3), "view_retry")


def test_once_every_member_reported_the_retry_is_prepared_at_once():
    s = formed()
    for r in range(3):
        assert of(failed(at(s, 10), r, 1, 7, 6), ViewPrepare) == []
    assert one(failed(at(s, 10), 3, 1, 7, 6), ViewPrepare).cause["kind"] == "view_retry"


def test_twin_a_report_that_blames_someone_is_not_a_stall():
    """A failure with a hint goes the ordinary way (the Healthy Set), never through a retry."""
    s = formed()
    payload = {"incarnation": s.inc(0), **links_event((3,), (3,), True, 1, (7, 6))}
    at(s, 10).record("links", "g", 0, payload)
    assert "failed" not in payload
    effects = at(s, 10.2).tick()
    prepare = one(effects, ViewPrepare)
    assert prepare.cause["kind"] == "auto_deactivation" and prepare.active_ranks == (0, 1, 2)


def test_a_real_death_reported_in_the_window_wins_over_the_retry():
    s = formed()
    failed(at(s, 10), 0, 1, 7, 6)
    effects = at(s, 10.1).death(3) + s.at(10.2).tick()
    prepares = of(effects, ViewPrepare)
    assert [p.cause["kind"] for p in prepares] == ["auto_deactivation"]
    commit(s)
    assert s.m.group_status("g")["change_in_flight"] is None
    assert of(at(s, 30).tick(), ViewPrepare) == []  # the stall of view 1 is forgotten


def test_a_retry_that_fails_again_lets_the_laggard_go():
    s = formed()
    failed(at(s, 10), 0, 1, 7, 6)
    at(s, 10.2).tick()
    commit(s)
    # The retry fails too before any operation completed: rank 2 never started the step's op.
    for r, issued in ((0, 1), (1, 1), (3, 1)):
        assert of(failed(at(s, 11 + r / 100), r, 2, issued, 0), ViewPrepare) == []
    effects = failed(at(s, 11.05), 2, 2, 0, 0)  # the last member's report decides at once
    prepare = one(effects, ViewPrepare)
    assert prepare.cause["kind"] == "view_failed" and prepare.active_ranks == (0, 1, 3)
    assert "ranks [2] had issued fewer than the 1 operations" in prepare.cause["detail"]
    view = commit(s).view
    assert (view.version, view.active_ranks) == (3, (0, 1, 3))


def test_a_member_that_never_reports_the_retry_failure_is_a_laggard_at_the_deadline():
    s = formed()
    failed(at(s, 10), 0, 1, 7, 6)
    at(s, 10.2).tick()
    commit(s)
    for r in (0, 1, 2):
        failed(at(s, 11), r, 2, 3, 0)
    beat_all(s.at(13))  # rank 3 is alive, yet says nothing about the failure
    assert of(at(s, 13.9).tick(), ViewPrepare) == []
    beat_all(s.at(13.95))
    prepare = one(at(s, 14).tick(), ViewPrepare)
    assert prepare.active_ranks == (0, 1, 2) and "no report from [3]" in prepare.cause["detail"]


def test_a_retry_that_fails_again_with_nobody_behind_shuts_the_group_down_once():
    s = formed(checkpoint_rank=1)
    failed(at(s, 10), 0, 1, 7, 6)
    at(s, 10.2).tick()
    commit(s)
    effects: list[Any] = []
    for r in range(4):
        effects += failed(at(s, 11), r, 2, 2, 1 if r else 0)
    shutdown = one(effects, ShutdownWithSave)
    assert shutdown.reason == "unresolved_view_failure" and shutdown.checkpoint_rank == 1
    assert "every member issued as many operations" in shutdown.detail
    assert of(effects, ViewPrepare) == []
    more = failed(at(s, 12), 0, 2, 2, 0) + at(s, 40).tick()
    assert of(more, ShutdownWithSave) == [] and of(more, ViewPrepare) == []


def test_a_retry_on_which_every_member_completed_work_is_retried_again():
    s = formed()
    failed(at(s, 10), 0, 1, 7, 6)
    at(s, 10.2).tick()
    commit(s)
    effects: list[Any] = []
    for r in range(4):  # an hour of steps later, a new failure of the retry view
        effects += failed(at(s, 3600), r, 2, 9000, 8999)
    prepare = one(effects, ViewPrepare)
    assert prepare.cause["kind"] == "view_retry" and prepare.active_ranks == (0, 1, 2, 3)
    assert "its retry had worked" in prepare.cause["detail"]


def test_without_auto_deactivation_the_laggard_is_named_and_the_view_is_left_alone():
    s = formed(auto_deactivate_on_failure=False)
    failed(at(s, 10), 0, 1, 7, 6)
    assert one(at(s, 10.2).tick(), ViewPrepare).cause["kind"] == "view_retry"  # same ranks
    commit(s)
    effects: list[Any] = []
    for r, issued in ((0, 4), (1, 4), (2, 3), (3, 4)):
        effects += failed(at(s, 11), r, 2, issued, 0)
    assert of(effects, ViewPrepare) == []
    [named] = of(effects, RankState)
    assert named.rank == 2 and named.reason.startswith("blamed: version 2 failed")


def test_reports_about_an_older_view_or_from_an_inactive_rank_are_not_a_stall():
    s = formed()
    at(s, 5).propose("deactivate", [3])
    commit(s)
    failed(at(s, 10), 0, 1, 7, 6)  # about view 1: the group is at view 2
    failed(at(s, 10), 3, 2, 0, 0)  # rank 3 is not active in view 2
    assert of(at(s, 20).tick(), ViewPrepare) == []
    assert s.m.next_deadline() is None or s.m.next_deadline() > s.now


def test_a_stall_survives_a_snapshot_and_replays_identically():
    s = formed()
    failed(at(s, 10), 0, 1, 7, 6)
    failed(at(s, 10.1), 1, 1, 7, 6)
    restored = Script(Coordinator.from_snapshot(s.m.snapshot()))
    restored.now, restored.incarnations = s.now, dict(s.incarnations)
    a, b = s.at(10.2).tick(), restored.at(10.2).tick()
    assert encode(a) == encode(b) and one(a, ViewPrepare).cause["kind"] == "view_retry"
    fresh = Coordinator()
    replayed = [e for rec in s.records for e in fresh.step(rec)]
    assert fresh.snapshot() == s.m.snapshot()
    assert encode(replayed[-1:]) == encode(a[-1:])
