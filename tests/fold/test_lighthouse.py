"""torchft's quorum rule in the fold (``facets/lighthouse/fold.py``): records at chosen
times in, quorums out, no clock. Each guard of the rule has a twin: one case where it holds the
quorum back, one where it lets it through, so a later change cannot silently disable it. The
same rule reaches torchft's own managers in tests/lighthouse/."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from foldplane.coordinator.fold.effects import Refused
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.facets.lighthouse.effects import QuorumDecided, ReplicaLost
from foldplane.facets.lighthouse.fold import Lighthouse, quorum_compute
from foldplane.facets.lighthouse.messages import QuorumMember
from foldplane.facets.lighthouse.rows import ROWS
from tests.fold.script import Script, of

SETTINGS = {
    "min_replicas": 1,
    "join_timeout_ms": 60_000,
    "quorum_tick_ms": 100,
    "heartbeat_timeout_ms": 5_000,
}


def lighthouse(**settings: Any) -> Script:
    s = Script()
    s.record("lighthouse_configured", None, None, {**SETTINGS, **settings})
    return s


def ask(s: Script, replica: str, step: int = 0, **member: Any) -> list[Any]:
    return s.record(
        "lighthouse_request",
        None,
        None,
        {"replica_id": replica, "step": step, "world_size": 1, **member},
    )


def beat(s: Script, *replicas: str) -> list[Any]:
    return s.record("lighthouse_heartbeat", None, None, {"replicas": list(replicas)})


def tick(s: Script) -> list[Any]:
    return s.record("tick", None, None, {})


def facet(s: Script) -> Lighthouse:
    return s.m.facet("lighthouse")


def quorums(effects: list[Any]) -> list[QuorumDecided]:
    return of(effects, QuorumDecided)


def members(q: QuorumDecided) -> list[str]:
    return [m.replica_id for m in q.participants]


def formed(*replicas: str, **settings: Any) -> Script:
    """A lighthouse whose first quorum is ``replicas``: all heartbeat at t=0, then all ask (the
    last one completes it: the others wait for it, a straggler)."""
    s = lighthouse(**settings).at(0)
    beat(s, *replicas)
    effects: list[Any] = []
    for r in replicas:
        effects += ask(s, r)
    [q] = quorums(effects)
    assert members(q) == sorted(replicas) and q.quorum_id == 1
    return s


# -- min_replicas ------------------------------------------------------------------------------


def test_min_replicas_holds_a_new_quorum_back() -> None:
    s = lighthouse(min_replicas=2).at(0)
    assert quorums(ask(s, "a")) == []
    assert "need min_replicas 2" in facet(s).status
    assert facet(s).next_deadline() is not None  # a's heartbeat running out may change it


def test_min_replicas_met_issues_the_quorum() -> None:
    s = lighthouse(min_replicas=2).at(0)
    ask(s, "a")
    [q] = quorums(ask(s.at(0.01), "b"))
    assert members(q) == ["a", "b"] and q.quorum_id == 1 and q.changed
    assert q.reason.startswith("Valid quorum found [2/2 participants healthy]")
    assert [v.included for v in q.verdicts] == [True, True]
    assert "step 0" in q.verdicts[0].why


# -- split brain -------------------------------------------------------------------------------


def test_half_of_the_healthy_replicas_is_not_a_quorum() -> None:
    s = lighthouse(min_replicas=1).at(0)
    beat(s, "b", "c")
    assert quorums(ask(s, "a")) == []
    assert "need at least half of 3 healthy workers" in facet(s).status


def test_more_than_half_of_the_healthy_replicas_is_a_quorum_after_the_join_timeout() -> None:
    s = lighthouse(min_replicas=1, join_timeout_ms=500).at(0)
    beat(s, "c")
    ask(s, "a")
    assert quorums(ask(s, "b")) == []
    assert "waiting for 1 healthy but not participating stragglers" in facet(s).status
    assert facet(s).next_deadline() == s.now + 500_000_000
    [q] = quorums(tick(s.at(0.5)))
    assert members(q) == ["a", "b"]
    [c] = [v for v in q.verdicts if v.replica_id == "c"]
    assert not c.included and "not asking for a quorum" in c.why


# -- join timeout ------------------------------------------------------------------------------


def test_a_straggler_that_asks_within_the_join_timeout_is_in() -> None:
    s = lighthouse(min_replicas=1, join_timeout_ms=500).at(0)
    beat(s, "c")
    ask(s, "a")
    ask(s, "b")
    [q] = quorums(ask(s.at(0.2), "c"))
    assert members(q) == ["a", "b", "c"]


def test_the_join_timeout_counts_from_the_first_participant() -> None:
    s = lighthouse(min_replicas=1, join_timeout_ms=500).at(0)
    beat(s, "c")
    ask(s, "a")
    ask(s.at(0.4), "b")
    assert quorums(tick(s.at(0.45))) == []
    assert quorums(tick(s.at(0.5))) != []


# -- fast quorum -------------------------------------------------------------------------------


def test_a_fast_quorum_forms_as_soon_as_every_last_member_is_back() -> None:
    s = formed("a", "b")
    beat(s.at(1), "c")  # a newcomer heartbeating does not delay it
    ask(s.at(2), "a", step=1)
    [q] = quorums(ask(s, "b", step=1))
    assert members(q) == ["a", "b"] and q.quorum_id == 1 and not q.changed
    assert q.reason.startswith("Fast quorum found!")
    assert [m.step for m in q.participants] == [1, 1]


def test_without_every_last_member_a_quorum_is_not_fast() -> None:
    s = formed("a", "b", min_replicas=2)
    beat(s.at(1), "b")
    assert quorums(ask(s.at(2), "a", step=1)) == []
    assert facet(s).status.startswith("New quorum not ready")


def test_a_newcomer_asking_with_the_last_members_joins_the_fast_quorum() -> None:
    s = formed("a", "b")
    ask(s.at(1), "c")
    ask(s, "a", step=1)
    [q] = quorums(ask(s, "b", step=1))
    assert members(q) == ["a", "b", "c"] and q.quorum_id == 2 and q.changed


def test_a_fast_quorum_awaits_the_last_members_that_have_not_asked() -> None:
    s = formed("a", "b", "c")
    assert facet(s).awaited(s.now) == ["a", "b", "c"]
    ask(s.at(1), "a", step=1)
    assert facet(s).awaited(s.now) == ["b", "c"]
    assert facet(s).awaited(s.now, {"b"}) == ["c"]  # b's request is on its way
    assert facet(s).awaited(s.now, {"b", "c"}) == []


def test_a_fast_quorum_awaits_no_member_that_is_silent_or_lost() -> None:
    s = formed("train0:u1", "train1:u2", "train2:u3")
    beat(s.at(4), "train0:u1", "train1:u2")  # train2's last beat: t=0
    assert facet(s).awaited(s.at(4.9).now) == ["train0:u1", "train1:u2", "train2:u3"]
    assert facet(s).awaited(s.at(5).now) == ["train0:u1", "train1:u2"]  # past 5000 ms
    s.record("lighthouse_lost", None, None, {"replica": "train1", "reason": "exit code -9"})
    assert facet(s).awaited(s.now) == ["train0:u1"]


def member(replica: str, step: int = 1) -> QuorumMember:
    return QuorumMember(replica_id=replica, step=step, world_size=1)


MS = 1_000_000


def test_requests_that_decide_nothing_may_wait_for_the_rest_of_the_last_quorum() -> None:
    s = formed("a", "b")  # all beat at t=0: b's heartbeat runs out at t=5
    now = s.at(1).now
    assert facet(s).gather_until(now, [member("a")], 100 * MS) == now + 100 * MS
    # never past the next moment the rule could answer otherwise on its own
    assert facet(s).gather_until(now, [member("a")], 10_000 * MS) == s.at(5).now


def test_twin_requests_that_would_decide_a_quorum_wait_for_nobody() -> None:
    s = formed("a", "b", join_timeout_ms=1_000)
    ask(s.at(1), "c")  # a newcomer waits: one of three healthy is no majority
    beat(s.at(2), "a", "b")
    # a and c are a majority of the three, and c has waited past the join timeout: a's
    # request decides a quorum at once, without b, so it waits for nobody
    assert facet(s).gather_until(s.now, [member("a")], 100 * MS) is None
    [q] = quorums(ask(s, "a", step=1))
    assert members(q) == ["a", "c"]


def test_twin_nothing_waits_once_the_last_quorum_is_complete_or_gone() -> None:
    s = formed("a", "b")
    assert facet(s).gather_until(s.at(1).now, [member("a"), member("b")], 100 * MS) is None
    assert facet(s).gather_until(s.at(6).now, [member("a")], 100 * MS) is None  # b silent
    s2 = lighthouse().at(0)
    assert facet(s2).gather_until(s2.now, [member("a")], 100 * MS) is None  # no quorum yet


def test_before_any_quorum_nothing_is_awaited() -> None:
    s = lighthouse().at(0)
    beat(s, "a", "b")
    assert facet(s).awaited(s.now) == []


# -- heartbeat timeout -------------------------------------------------------------------------


def test_a_silent_member_is_out_once_its_heartbeat_times_out() -> None:
    s = formed("a", "b")
    beat(s.at(1), "a", "b")  # b's last beat: t=1
    ask(s.at(2), "a", step=1)
    assert facet(s).next_deadline() == s.now - 1_000_000_000 + 5_000_000_000
    assert quorums(tick(s.at(5.9))) == []
    [q] = quorums(tick(s.at(6)))
    assert members(q) == ["a"] and q.quorum_id == 2
    [b] = [v for v in q.verdicts if v.replica_id == "b"]
    assert not b.included and "past heartbeat_timeout_ms 5000" in b.why


def test_a_member_that_keeps_heartbeating_is_waited_for() -> None:
    s = formed("a", "b", join_timeout_ms=60_000)
    ask(s.at(1), "a", step=1)
    for t in range(2, 12):
        beat(s.at(t), "b")
        assert quorums(tick(s)) == []


# -- a death the launcher saw ------------------------------------------------------------------


def test_a_lost_replica_group_is_out_at_once() -> None:
    s = formed("train0:u1", "train1:u2")
    ask(s.at(1), "train0:u1", step=1)
    effects = s.record(
        "lighthouse_lost", None, None, {"replica": "train1", "reason": "exit code -9"}
    )
    [lost] = of(effects, ReplicaLost)
    assert lost.replica_ids == ("train1:u2",)
    [q] = quorums(effects)
    assert members(q) == ["train0:u1"] and q.quorum_id == 2
    [gone] = [v for v in q.verdicts if v.replica_id == "train1:u2"]
    assert not gone.included and f"reported it dead at offset {s.offset}" in gone.why
    # its beat still in flight is ignored; a request from it is refused
    beat(s.at(1.1), "train1:u2")
    assert "train1:u2" not in facet(s).beats
    [refused] = of(ask(s, "train1:u2"), Refused)
    assert refused.code == "replica_lost" and "offset" in refused.message
    # the replacement asks under a new id and is back in the next fast quorum
    assert quorums(ask(s.at(2), "train1:u3", step=0)) == []
    [q] = quorums(ask(s, "train0:u1", step=2))
    assert members(q) == ["train0:u1", "train1:u3"] and q.quorum_id == 3


def test_a_lost_report_names_only_that_replica_groups_incarnations() -> None:
    s = formed("train1:u1", "train10:u2", "train1")
    effects = s.record("lighthouse_lost", None, None, {"replica": "train1", "reason": "died"})
    [lost] = of(effects, ReplicaLost)
    assert lost.replica_ids == ("train1", "train1:u1")
    assert "train10:u2" in facet(s).beats


# -- quorum id ---------------------------------------------------------------------------------


def test_commit_failures_move_the_quorum_id_even_with_the_same_members() -> None:
    s = formed("a", "b")
    ask(s.at(1), "a", commit_failures=1)
    [q] = quorums(ask(s, "b"))
    assert members(q) == ["a", "b"] and q.quorum_id == 2 and q.changed


def test_an_unchanged_quorum_writes_no_row_and_a_changed_one_does() -> None:
    s = formed("a", "b")
    ask(s.at(1), "a")
    [same] = quorums(ask(s, "b"))
    assert ROWS[QuorumDecided](same) == []
    ask(s.at(2), "c")
    ask(s, "a")
    [moved] = quorums(ask(s, "b"))
    [row] = ROWS[QuorumDecided](moved)
    assert (row.kind, row.group, row.seq) == ("lighthouse_quorum", "lighthouse", 2)
    assert [p["replica_id"] for p in row.doc["participants"]] == ["a", "b", "c"]


# -- shrink only -------------------------------------------------------------------------------


def test_shrink_only_keeps_newcomers_out() -> None:
    s = formed("a", "b")
    ask(s.at(1), "c")
    ask(s, "a", shrink_only=True)
    [q] = quorums(ask(s, "b"))
    assert members(q) == ["a", "b"]
    [c] = [v for v in q.verdicts if v.replica_id == "c"]
    assert "shrink_only" in c.why
    assert "c" in facet(s).requests  # still asking: it may join the next one


def test_without_shrink_only_newcomers_join() -> None:
    s = formed("a", "b")
    ask(s.at(1), "c")
    ask(s, "a", shrink_only=False)
    [q] = quorums(ask(s, "b"))
    assert members(q) == ["a", "b", "c"]


# -- the calls that end ------------------------------------------------------------------------


def test_a_withdrawn_request_is_not_counted_on() -> None:
    s = lighthouse(min_replicas=2).at(0)
    ask(s, "a")
    offset = s.offset
    s.record("lighthouse_withdrawn", None, None, {"replica_id": "a", "request": offset})
    assert quorums(ask(s, "b")) == []
    assert "a" not in facet(s).requests


def test_a_withdrawal_of_an_older_request_leaves_the_newer_one() -> None:
    s = lighthouse(min_replicas=2).at(0)
    ask(s, "a")
    old = s.offset
    ask(s, "a")
    s.record("lighthouse_withdrawn", None, None, {"replica_id": "a", "request": old})
    assert members(quorums(ask(s, "b"))[0]) == ["a", "b"]


def test_a_resumed_coordinator_restarts_heartbeats_and_forgets_the_calls_of_the_old_one() -> None:
    s = formed("a", "b")
    ask(s.at(1), "a")
    s.at(30).record("tick", None, None, {"resumed": True})
    assert facet(s).requests == {}
    assert set(facet(s).beats.values()) == {s.now}
    ask(s.at(31), "a")
    [q] = quorums(ask(s, "b"))  # both healthy again: fast
    assert members(q) == ["a", "b"]


# -- the rule's time ---------------------------------------------------------------------------


def test_ticks_are_at_least_quorum_tick_ms_apart() -> None:
    s = formed("a", "b", quorum_tick_ms=1000)
    beat(s.at(1), "b")
    ask(s.at(1), "a")
    beat(s.at(1.5), "c")
    tick(s.at(5.9))  # nothing due
    beat(s.at(6.0), "b")
    # b's expiry at 11 s; c's at 6.5 s, but the last tick was at 5.9 s: no sooner than 6.9 s
    assert facet(s).next_deadline() == s.now + 900_000_000


def test_nothing_waits_nothing_ticks() -> None:
    s = formed("a", "b")
    beat(s.at(1), "a", "b")
    assert facet(s).next_deadline() is None
    assert s.m.next_deadline() is None


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "group", "payload", "says"),
    [
        ("lighthouse_request", "g", {"replica_id": "a"}, "names no group"),
        ("lighthouse_request", None, {"replica_id": ""}, "replica_id"),
        ("lighthouse_request", None, {"replica_id": "a", "step": "x"}, "step"),
        ("lighthouse_request", None, {"replica_id": "a", "zzz": 1}, "zzz"),
        ("lighthouse_heartbeat", None, {"replicas": []}, "names no replica"),
        ("lighthouse_heartbeat", None, {"replicas": ["x" * 600]}, "1 to 512 bytes"),
        ("lighthouse_lost", None, {"replica": "a"}, "reason"),
        ("lighthouse_configured", None, {**SETTINGS, "min_replicas": 0}, "min_replicas"),
        ("lighthouse_configured", None, {**SETTINGS, "heartbeat_timeout_ms": -1}, "heartbeat"),
        ("lighthouse_withdrawn", None, {"replica_id": "a"}, "request"),
    ],
)
def test_a_malformed_record_is_refused_naming_what_is_wrong(
    kind: str, group: str | None, payload: dict[str, Any], says: str
) -> None:
    s = lighthouse()
    [refused] = of(s.record(kind, group, None, payload), Refused)
    assert refused.code == "invalid_event" and says in refused.message
    assert facet(s).requests == {} and facet(s).quorum_id == 0


def test_a_request_before_the_settings_is_refused() -> None:
    s = Script()
    [refused] = of(ask(s, "a"), Refused)
    assert "no settings" in refused.message


# -- replay ------------------------------------------------------------------------------------


def test_snapshot_and_tail_decide_exactly_what_the_whole_log_decides() -> None:
    s = formed("a", "b")
    ask(s.at(1), "a", reconfigure_handles=["h-a"])
    beat(s.at(1.2), "c")
    ask(s.at(2), "b", reconfigure_handles=["h-b"])
    s.record("lighthouse_lost", None, None, {"replica": "c", "reason": "gone"})
    ask(s.at(3), "a")
    cut = len(s.records)
    beat(s.at(4), "b")
    tick(s.at(9))
    ask(s.at(9.5), "b")
    whole = Coordinator()
    full = [e for r in s.records for e in whole.step(r)]
    first = Coordinator()
    for r in s.records[:cut]:
        first.step(r)
    restored = Coordinator.from_snapshot(json.loads(json.dumps(first.snapshot())))
    tail = [e for r in s.records[cut:] for e in restored.step(r)]
    assert msgspec.json.encode(tail) == msgspec.json.encode(full[-len(tail) :] if tail else [])
    assert restored.snapshot() == whole.snapshot()


def test_the_rule_is_a_function_of_its_inputs() -> None:
    f = facet(formed("a", "b"))
    assert f.settings is not None and f.last is not None
    one = quorum_compute(f.now, f.requests, f.beats, f.last, f.settings)
    two = quorum_compute(f.now, dict(f.requests), dict(f.beats), f.last, f.settings)
    assert one == two
