"""A rank's story (coordinator/host/story.py), told from records fed at chosen times: no clock, no
server. The story is read from what the fold itself did, so each test checks that the fold's
own reasons, offsets and times come through, in order, and that memory stays bounded."""

from __future__ import annotations

import pytest

from foldplane.coordinator.host.story import EVIDENCE_LIMIT, StoryBuilder, StoryError, format_story
from tests.fold.script import T0, S, Script


def story(s: Script, group: str, rank: int, until: int | None = None) -> dict:
    builder = StoryBuilder(group, rank)
    builder.feed(r for r in s.records if until is None or r.offset <= until)
    return builder.result()


def events(st: dict) -> list[tuple[str, str]]:
    return [(e["record"], e["event"]) for e in st["entries"]]


def test_a_heartbeat_timeout_names_the_last_heartbeat_and_the_view_that_removed_it():
    s = Script()
    s.form(world_size=3, heartbeat_timeout_s=10, ack_timeout_s=30)
    for t in (1, 2, 3):
        s.at(t)
        for r in range(3):
            s.beat(r)
    last_beat = s.offset  # rank 2's last heartbeat
    s.at(8)
    s.beat(0)
    s.beat(1)
    s.at(13.5)
    s.tick()  # rank 2's deadline (3 + 10) has passed
    timeout_offset = s.offset
    s.ack_all()

    st = story(s, "g", 2)
    assert st["state"] == "OFFLINE" and st["active"] is False and st["version"] == 2
    assert st["heartbeats"] == 3
    beats = [e for e in st["entries"] if e["event"] == "heartbeat"]
    assert len(beats) == 1  # only the one a timeout is measured from
    beat = beats[0]
    assert beat["offset"] == last_beat and beat["ts"] == T0 + 3 * S
    assert "last heartbeat before it went OFFLINE (3 since" in beat["reason"]
    offline = st["entries"][st["entries"].index(beat) + 1]
    assert offline["event"] == "rank_state" and offline["state"] == "OFFLINE"
    assert offline["offset"] == timeout_offset and offline["record"] == "tick"
    assert offline["reason"] == (
        f"heartbeat timeout: last sign of life at {T0 + 3 * S}, deadline {T0 + 13 * S}"
    )
    committed = st["entries"][-1]
    assert committed["event"] == "view_committed" and committed["version"] == 2
    assert committed["active"] is False and committed["cause"] == "auto_deactivation"
    assert st["membership_since"] == committed["offset"]
    assert st["summary"].startswith("rank 2 of 'g' is OFFLINE, outside active_ranks of version 2")
    assert "heartbeat timeout" in st["summary"]


def test_a_failure_hint_that_puts_a_rank_outside_the_healthy_set_is_in_its_story():
    s = Script()
    s.form(world_size=4, reconcile_window_s=0.5)
    s.at(1)
    s.links(0, hint=[3])
    hint_offset = s.offset
    s.links(1, down=(3,))
    s.at(2)
    s.tick()  # the window closes: 3 leaves the Healthy Set, auto-deactivation starts
    s.ack_all()

    st = story(s, "g", 3)
    assert st["state"] == "SYNCED" and not st["active"]
    reports = [e for e in st["entries"] if e["event"] == "down_report"]
    assert [(e["reporter"], e["offset"]) for e in reports] == [
        (0, hint_offset),
        (1, hint_offset + 1),
    ]
    assert reports[0]["reason"] == "rank 0 reports rank 3 down (failed_ranks_hint)"
    assert reports[1]["reason"] == "rank 1 reports rank 3 down (a link probe)"
    left = [e for e in st["entries"] if e.get("state") == "SYNCED"][-1]
    assert left["record"] == "tick"
    assert left["reason"] == "left the Healthy Set (3 ranks): links down to [0, 1]"
    assert st["entries"].index(reports[1]) < st["entries"].index(left)
    committed = st["entries"][-1]
    assert (committed["event"], committed["version"], committed["active"]) == (
        "view_committed",
        2,
        False,
    )
    assert "3 SYNCED" in committed["reason"]
    # rank 0's own story shows its report as its own links evidence, not as news about rank 0
    own = story(s, "g", 0)
    assert ("links", "links") in events(own)
    own_reports = [e["reason"] for e in own["entries"] if e["event"] == "links"]
    assert own_reports[-1] == "its links report: peers [3] down; self_ready true"


def test_a_late_report_about_the_replaced_process_is_told_as_not_counted():
    """Rank 2 is replaced and activated again (view 3); rank 0 then reports rank 2 down on
    view 1, the view of the old process: the replacement's story says so and why it did not
    count, and the replacement stays HEALTHY and active."""
    s = Script()
    s.form(world_size=4)
    s.at(1).death(2)
    s.ack_all()
    s.at(2).join(2, incarnation="g-2-b")
    s.record("links", "g", 2, {"incarnation": "g-2-b", "self_ready": True, "version": 0})
    s.propose("activate", [2])
    s.ack_all()
    late = {"incarnation": s.inc(0), "self_ready": True, "version": 1, "down": [2], "hint": [2]}
    s.at(5).record("links", "g", 0, late)
    st = story(s, "g", 2)
    assert st["state"] == "HEALTHY" and st["active"] and st["version"] == 3
    entry = [e for e in st["entries"] if e["event"] == "down_report_not_counted"]
    assert [(e["reporter"], e["offset"]) for e in entry] == [(0, s.offset)]
    assert entry[0]["reason"] == (
        "rank 0 reports rank 2 down on view 1; not counted: rank 2's incarnation joined when "
        "view 2 was committed, so that view ran with the process it replaced"
    )
    assert not [e for e in st["entries"] if e["event"] == "down_report"]
    # twin: about view 3, the replacement's own view, the report counts and is told so
    s.at(5.1).record("links", "g", 0, late | {"version": 3})
    st = story(s, "g", 2)
    assert [e["offset"] for e in st["entries"] if e["event"] == "down_report"] == [s.offset]


def test_a_proposal_and_a_new_incarnation_are_told_with_the_fold_s_reasons():
    s = Script()
    s.form(world_size=3)
    s.at(1)
    s.death(1, reporter="launcher")
    s.ack_all()
    s.at(2)
    s.join(1, incarnation="g-1-b")
    s.links(1)
    s.propose("activate", [1], proposer="scheduler")
    proposal_id = s.offset
    s.ack_all()

    st = story(s, "g", 1)
    assert st["active"] and st["state"] == "HEALTHY" and st["rank_epoch"] == 2
    reasons = [e["reason"] for e in st["entries"]]
    assert "death reported by launcher" in reasons
    assert "joined as incarnation g-1-b (rank_epoch 2)" in reasons
    accepted = next(e for e in st["entries"] if e["event"] == "proposal")
    assert accepted["proposal"] == proposal_id
    assert accepted["reason"] == f"proposal {proposal_id}: activate [1] by scheduler queued"
    resolved = next(e for e in st["entries"] if e["event"] == "proposal_resolved")
    assert resolved["status"] == "applied" and resolved["version"] == 3
    assert resolved["reason"].endswith("applied: committed in version 3")
    versions = [
        (e["version"], e["active"]) for e in st["entries"] if e["event"] == "view_committed"
    ]
    assert versions == [(1, True), (2, False), (3, True)]

    # the same records give the same story (the fold is deterministic), and --until cuts it
    assert story(s, "g", 1) == st
    early = story(s, "g", 1, until=proposal_id - 1)
    assert early["active"] is False and early["version"] == 2
    text = format_story(st)
    assert text.splitlines()[0] == st["summary"]
    assert all(e["reason"] in text for e in st["entries"])


def test_a_long_log_keeps_every_decision_but_only_the_recent_evidence():
    s = Script()
    s.form(world_size=3, heartbeat_timeout_s=10_000, reconcile_window_s=0)
    flips = 3 * EVIDENCE_LIMIT
    for i in range(flips):
        s.at(1 + i / 1000)
        s.links(2, ready=True, down=(0,) if i % 2 == 0 else ())  # rank 2's view flaps
        s.beat(2)
    for i in range(2000):
        s.at(5 + i / 1000)
        s.beat(2)

    st = story(s, "g", 2)
    assert st["heartbeats"] == flips + 2000
    assert sum(e["event"] == "heartbeat" for e in st["entries"]) == 1  # only the latest
    assert st["omitted"]["heartbeats"] == flips + 2000 - 1
    # each flip moves 2 in and out of the Healthy Set: a decision, kept with its evidence
    decisions = [e for e in st["entries"] if e["event"] == "rank_state"]
    assert len(decisions) >= flips
    assert len(st["entries"]) < 4 * flips + 50


def test_evidence_with_no_decision_is_bounded():
    s = Script()
    s.form(world_size=3, heartbeat_timeout_s=10_000)
    for i in range(5 * EVIDENCE_LIMIT):
        s.at(1 + i / 1000)
        s.ack(2, version=1)  # a repeated ACK: evidence, no decision
    st = story(s, "g", 2)
    acks = [e for e in st["entries"] if e["event"] == "ack"]
    # the ACK of the formation barrier came before its decision; the rest trail the story
    assert len(acks) <= EVIDENCE_LIMIT + 1
    assert st["omitted"]["evidence"] > 0


def test_an_unknown_group_or_a_rank_outside_the_group_is_an_error():
    s = Script()
    s.form(world_size=2)
    with pytest.raises(StoryError) as unknown:
        story(s, "nope", 0)
    assert unknown.value.code == "unknown_group" and "no group 'nope'" in unknown.value.detail
    with pytest.raises(StoryError) as outside:
        story(s, "g", 5)
    assert outside.value.code == "rank_out_of_range" and "0..1" in outside.value.detail


def test_the_data_story_says_which_range_a_rank_held_and_who_took_it_over():
    from tests.fold.test_epochs import kill, plan, progress

    s = Script()
    s.form(world_size=4)
    plan(s, dataset_size=20_000, lookahead=10)
    for r in range(4):
        progress(s, r, 1_234)
    kill(s, 2)  # rank 2 held 10,000..14,999 and reported 1,234 of it
    for r in (0, 1, 3):
        progress(s, r, 2_000)
    s.join(2, incarnation="g-2-b")
    s.links(2)
    s.propose("activate", [2])
    s.ack_all()

    st = story(s, "g", 2)
    data = [e for e in st["entries"] if e["event"].startswith(("epoch", "assignment"))]
    assert [e["event"] for e in data] == [
        "epoch_planned",
        "assignment_changed",
        "assignment_changed",
    ]
    planned, left, joined = data
    assert planned["reason"].startswith("epoch 0 planned over version 1 (20,000 positions")
    assert planned["reason"].endswith("it holds 10,000..14,999")
    assert left["version"] == 2 and left["processed"] == 1_234 and left["remaining"] == []
    # 3,766 left: 1,256 + 1,255 + 1,255 in rank order, from position 11,234 on
    assert left["reason"].startswith(
        "epoch 0: rank 2 held 10,000..14,999; it had processed 1,234 when it left view 2; "
        "ranks 0, 1, 3 took its remaining 3,766 (0: 1,256 from 11,234, 1: 1,255 from 12,490, "
        "3: 1,255 from 13,745)"
    )
    assert [m[:2] for m in left["moves"]] == [[2, 0], [2, 1], [2, 3]]
    assert sum(m[3] for m in left["moves"]) == 3_766
    # the replacement's share comes from the survivors' tails, never the old range again
    assert joined["version"] == 3 and joined["cause"] == "view_committed"
    assert joined["reason"].startswith("epoch 0: it joined view 3 and got ")
    assert "from ranks 0, 1, 3 (0: 1,064 in 11,426..12,489, 1: 1,063 in " in joined["reason"]
    assert all(m[1] == 2 and m[0] in (0, 1, 3) for m in joined["moves"])
    got = sum(m[3] for m in joined["moves"])
    assert joined["remaining"] and sum(n for _, n in joined["remaining"]) == got
    # the rank's cursor goes on from what its old incarnation reported
    assert st["summary"].endswith(f"epoch 0 (open): processed 1,234, {got:,} remaining")
    assert "assignment_changed e0" in format_story(st)

    # a survivor's story says what it got and from whom
    st0 = story(s, "g", 0)
    took = [e for e in st0["entries"] if e["event"] == "assignment_changed"]
    assert took[0]["reason"].startswith(
        "epoch 0: with view 2 it got 1,256 positions from rank 2 (in 11,234..12,489)"
    )
    assert took[1]["reason"].startswith("epoch 0: rank 0 gave ")
    assert "to rank 2 (from " in took[1]["reason"]


def test_the_data_story_tells_a_reclaim_and_the_epoch_s_end():
    from tests.fold.test_epochs import plan, progress

    s = Script()
    s.form(world_size=2)
    plan(s, dataset_size=1_000, split="throughput", lookahead=0)
    progress(s, 0, 100, rate=200.0)
    progress(s, 1, 100, rate=100.0)
    progress(s, 0, 500, rate=200.0)  # rank 0 ran dry; it reclaims from rank 1's tail
    e = s.m.facet("epochs").epoch("g")
    while e.completed is None:  # each report of a whole part may reclaim again
        for r in (0, 1):
            if e.completed is None:
                progress(s, r, e.holdings[r].held, rate=100.0)

    st = story(s, "g", 0)
    reclaim = next(e for e in st["entries"] if e["event"] == "assignment_changed")
    assert reclaim["cause"] == "reclaim"
    assert reclaim["reason"].startswith(
        "epoch 0: it had finished its part and reclaimed 266 positions from rank 1 (in 734..999)"
    )
    assert "[reclaim: rank 0 finished its part" in reclaim["reason"]
    end = st["entries"][-1]
    assert end["event"] == "epoch_completed"
    n = e.holdings[0].processed
    assert end["reason"] == (
        f"epoch 0 complete: every position processed once; it processed {n:,} of 1,000"
    )
    st1 = story(s, "g", 1)
    gave = next(e for e in st1["entries"] if e["event"] == "assignment_changed")
    assert gave["reason"].startswith(
        "epoch 0: rank 1 gave 266 of its remaining positions to rank 0"
    )
