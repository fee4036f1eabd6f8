"""torchrun's rendezvous in the fold (facets/rendezvous/fold.py): each rule of the
module docstring, with a twin for each guard, records at chosen times in and effects out (the
same rules reach HTTP in tests/service/test_rendezvous_api.py and real torchrun in
tests/agent/test_torchrun.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from foldplane.coordinator.fold.effects import Refused
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.facets.rendezvous.effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
    RoundFormed,
)
from foldplane.facets.rendezvous.rows import ROWS
from foldplane.facets.rendezvous.state import job_status
from foldplane.wire.codes import (
    INVALID_EVENT,
    NODE_GONE,
    RENDEZVOUS_CLOSED,
    RENDEZVOUS_CONFLICT,
    UNKNOWN_RENDEZVOUS,
)
from tests.fold.script import Script, encode, of, one

SETTINGS = {
    "min_nodes": 1,
    "max_nodes": 4,
    "last_call_s": 2.0,
    "join_timeout_s": 60.0,
    "keepalive_timeout_s": 5.0,
}


class Rdzv(Script):
    """A Script that speaks for torchrun nodes of one job."""

    job = "job"

    def __init__(self, machine: Coordinator | None = None, **settings: Any) -> None:
        super().__init__(machine)
        self.settings = {**SETTINGS, **settings}
        self.attempts = 0

    def node_join(
        self, node: str, cause: str = "first", restart_count: int = 0, /, **extra: Any
    ) -> list[Any]:
        self.attempts += 1
        payload = {
            "job": self.job,
            "node": node,
            "attempt": f"a{self.attempts}",
            "host": "127.0.0.1",
            "store_port": 20000 + self.attempts,
            "local_world_size": 2,
            "cause": cause,
            "restart_count": restart_count,
            **self.settings,
            **extra,
        }
        return self.record("rdzv_join", None, None, payload)

    def keepalive(self, node: str) -> list[Any]:
        return self.record("rdzv_keepalive", None, None, {"job": self.job, "node": node})

    def leave(self, node: str, reason: str = "stopped") -> list[Any]:
        return self.record(
            "rdzv_leave", None, None, {"job": self.job, "node": node, "reason": reason}
        )

    def close(self, node: str, reason: str = "the run ended") -> list[Any]:
        return self.record(
            "rdzv_close", None, None, {"job": self.job, "node": node, "reason": reason}
        )

    @property
    def facet(self) -> Any:
        return self.m.facet("rendezvous")

    def status(self) -> dict[str, Any]:
        return job_status(self.facet.job(self.job))

    def two_in_round_one(self) -> RoundFormed:
        """Nodes a and b join at 0 and 0.5 s; the last call (2 s after a) forms round 1, or
        b's join does when it is the ``max_nodes``-th."""
        effects = self.at(0).node_join("a")
        effects += self.at(0.5).node_join("b")
        self.at(1).keepalive("a")
        self.keepalive("b")
        effects += self.at(2).tick()
        return one(effects, RoundFormed)


def ranks(formed: RoundFormed) -> list[str]:
    return [n.node for n in formed.nodes]


# -- rule 1: the first join fixes the settings -----------------------------------------------------


def test_the_first_join_creates_the_job_and_a_join_with_other_settings_is_refused() -> None:
    s = Rdzv()
    created = one(s.at(0).node_join("a"), JobCreated)
    assert (created.min_nodes, created.max_nodes, created.last_call_s) == (1, 4, 2.0)
    refused = one(s.node_join("b", min_nodes=2, last_call_s=5), Refused)
    assert refused.code == RENDEZVOUS_CONFLICT
    assert "min_nodes 2 (the rendezvous has 1)" in refused.message
    assert "last_call_s 5 (the rendezvous has 2)" in refused.message
    assert s.status()["waiting"] == [p for p in s.status()["waiting"] if p["node"] == "a"]


def test_a_join_with_the_same_settings_is_not_refused() -> None:
    s = Rdzv()
    s.at(0).node_join("a")
    assert not of(s.node_join("b"), Refused)
    assert [p["node"] for p in s.status()["waiting"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("job", "bad id!", "rendezvous id"),
        ("node", "", "node id"),
        ("attempt", "x" * 65, "attempt id"),
        ("host", "a b", "store's host"),
        ("store_port", 0, "store_port must be an integer from 1 to 65535"),
        ("store_port", "80", "store_port must be an integer"),
        ("local_world_size", -1, "local_world_size"),
        ("restart_count", -1, "restart_count"),
        ("min_nodes", 0, "min_nodes"),
        ("max_nodes", True, "max_nodes"),
        ("last_call_s", -1, "last_call_s must be a number of seconds from 0"),
        ("join_timeout_s", 0, "join_timeout_s must be a number of seconds over 0"),
        ("keepalive_timeout_s", float("nan"), "keepalive_timeout_s"),
        ("cause", "because", "cause must be one of"),
    ],
)
def test_a_malformed_join_is_refused_naming_the_field(field: str, value: Any, words: str) -> None:
    s = Rdzv()
    refused = one(s.node_join("a", **{field: value}), Refused)
    assert refused.code == INVALID_EVENT and words in refused.message
    assert s.facet.job("job") is None


def test_max_below_min_and_a_group_or_rank_are_refused() -> None:
    s = Rdzv()
    refused = one(s.node_join("a", min_nodes=3, max_nodes=2), Refused)
    assert "max_nodes 2 is below min_nodes 3" in refused.message
    payload = {"job": "job", "node": "a"}
    refused = one(s.record("rdzv_keepalive", "g", None, payload), Refused)
    assert refused.code == INVALID_EVENT and "names no group and no rank" in refused.message


# -- rule 3c: the first round waits for its last call --------------------------------------------


def test_the_first_round_forms_when_the_last_call_ends_not_before() -> None:
    s = Rdzv()
    assert not of(s.at(0).node_join("a"), RoundFormed)
    assert s.status()["last_call_ts"] == s.now + 2 * 10**9
    assert not of(s.at(1.5).node_join("b"), RoundFormed)
    assert not of(s.at(1.9).tick(), RoundFormed)
    formed = one(s.at(2).tick(), RoundFormed)
    assert (formed.round, ranks(formed), formed.world_size) == (1, ["a", "b"], 4)
    assert "the last call (2 s after the 1st node joined) ended with 2 nodes" in formed.reason
    assert (formed.store_host, formed.store_port) == ("127.0.0.1", 20001)
    assert s.status()["waiting"] == [] and s.status()["last_call_ts"] is None


def test_the_last_call_starts_at_the_min_nodes_th_join_and_is_cancelled_below_it() -> None:
    s = Rdzv(min_nodes=2)
    s.at(0).node_join("a")
    assert s.status()["last_call_ts"] is None  # one of min 2
    s.at(1).node_join("b")
    assert s.status()["last_call_ts"] == s.now + 2 * 10**9
    s.at(1.5).leave("b")
    assert s.status()["last_call_ts"] is None
    assert not of(s.at(3.5).tick(), RoundFormed)
    s.at(4).keepalive("a")
    s.node_join("c")
    formed = one(s.at(6).tick(), RoundFormed)
    assert ranks(formed) == ["a", "c"] and "2nd node joined" in formed.reason


def test_max_nodes_waiting_forms_the_round_at_once() -> None:
    s = Rdzv(min_nodes=2, max_nodes=2)
    s.at(0).node_join("a")
    formed = one(s.at(0.1).node_join("b"), RoundFormed)
    assert ranks(formed) == ["a", "b"] and "max_nodes 2 nodes wait" in formed.reason


# -- rules 2, 3b, 4, 5: restarts ------------------------------------------------------------------


def test_a_restart_waits_for_every_running_member_then_forms_at_once() -> None:
    s = Rdzv()
    s.two_in_round_one()
    joined = one(s.at(3).node_join("b", "workers_failed", 1), NodeJoined)
    assert (joined.round, joined.left_round, joined.restart_count) == (2, 1, 1)
    assert "restarts after its workers failed (restart 1), leaving round 1" in joined.reason
    assert "still running round 1: a" in joined.reason
    assert s.status()["nodes_waiting"] == 1  # a's torchrun restarts to join
    assert not of(s.at(5).tick(), RoundFormed)  # no last call: a runs round 1
    formed = one(s.at(5.5).node_join("a", "nodes_waiting"), RoundFormed)
    assert formed.round == 2 and ranks(formed) == ["a", "b"]  # the old rank order
    assert "every live node of round 1 is back (a, b)" in formed.reason
    assert "back from round 1: a, b" in formed.reason


def test_its_twin_a_round_never_forms_while_a_member_runs_even_past_max_nodes() -> None:
    s = Rdzv(max_nodes=2)
    s.two_in_round_one()
    s.at(3).node_join("a", "workers_failed", 1)
    s.node_join("c")
    for t in (3.5, 7, 11, 15, 19):
        for node in "abc":
            s.at(t).keepalive(node)
        assert not of(s.at(t).tick(), RoundFormed)
    assert s.status()["round"] == 1


def test_a_newcomer_is_admitted_when_the_members_restart_for_it() -> None:
    s = Rdzv()
    s.two_in_round_one()
    s.at(3).node_join("c")
    assert s.status()["nodes_waiting"] == 1
    s.at(3.2).node_join("a", "nodes_waiting")
    formed = one(s.at(3.3).node_join("b", "nodes_waiting"), RoundFormed)
    assert ranks(formed) == ["a", "b", "c"] and "new: c" in formed.reason


def test_spares_wait_without_stopping_a_full_round_then_stay_for_the_next() -> None:
    s = Rdzv(max_nodes=2)
    s.two_in_round_one()
    s.at(3).node_join("c")
    assert s.status()["nodes_waiting"] == 0  # round 1 is full: c is a spare
    s.at(4).node_join("a", "workers_failed", 1)
    assert s.status()["nodes_waiting"] == 2  # a member waits: the round changes
    formed = one(s.at(4.1).node_join("b", "nodes_waiting"), RoundFormed)
    assert ranks(formed) == ["a", "b"] and formed.spares == ("c",)
    assert "c wait for the next round (max_nodes 2)" in formed.reason
    assert [p["node"] for p in s.status()["waiting"]] == ["c"]


def test_rank_zero_stays_with_a_member_when_it_can() -> None:
    s = Rdzv()
    s.at(0).node_join("z")
    s.at(0.5).node_join("y")
    formed = one(s.at(2).tick(), RoundFormed)
    assert ranks(formed) == ["z", "y"]  # the order they joined, not their names
    s.at(3).node_join("x")
    s.at(3.1).node_join("y", "nodes_waiting")
    formed = one(s.at(3.2).node_join("z", "nodes_waiting"), RoundFormed)
    assert ranks(formed) == ["z", "y", "x"]


def test_the_same_join_again_is_that_join() -> None:
    s = Rdzv()
    s.at(0).node_join("a")
    latest = s.facet.job("job").attempts["a"]
    payload = dict(s.records[-1].payload)
    assert s.m.repeat_of("rdzv_join", None, None, payload) == latest[1]
    assert s.m.repeat_of("rdzv_join", None, None, {**payload, "attempt": "other"}) is None


# -- rule 6: liveness ----------------------------------------------------------------------------


def test_a_silent_member_is_lost_and_the_round_forms_without_it() -> None:
    s = Rdzv()
    s.two_in_round_one()
    s.at(3).node_join("a", "workers_failed", 1)
    s.at(5.9).keepalive("a")
    assert not of(s.at(5.9).tick(), NodeLeft)  # b's last word was at 1 s: not yet 5 s
    effects = s.at(6).tick()
    lost = one(effects, NodeLeft)
    assert (lost.node, lost.how, lost.round) == ("b", "lost", 1)
    assert "no keep-alive for 5 s" in lost.reason
    formed = one(effects, RoundFormed)
    assert ranks(formed) == ["a"] and formed.round == 2
    assert "gone: b (lost at offset" in formed.reason


def test_its_twin_keepalives_keep_a_member_in() -> None:
    s = Rdzv()
    s.two_in_round_one()
    for t in range(2, 30):
        s.at(t).keepalive("a")
        s.keepalive("b")
        assert not of(s.tick(), NodeLeft)
    assert s.status()["live"] == ["a", "b"]


def test_a_resumed_coordinator_restarts_every_nodes_clock() -> None:
    s = Rdzv()
    s.two_in_round_one()
    s.at(30).record("tick", None, None, {"resumed": True})
    assert s.status()["live"] == ["a", "b"]
    assert not of(s.at(34).tick(), NodeLeft)
    assert {e.node for e in of(s.at(35).tick(), NodeLeft)} == {"a", "b"}


def test_a_keepalive_or_leave_from_a_node_not_in_the_job_is_refused_saying_why() -> None:
    s = Rdzv()
    refused = one(s.keepalive("a"), Refused)
    assert refused.code == UNKNOWN_RENDEZVOUS
    s.two_in_round_one()
    s.at(8).keepalive("a")
    s.tick()  # b lost at 6
    refused = one(s.keepalive("b"), Refused)
    assert refused.code == NODE_GONE and "lost at offset" in refused.message
    refused = one(s.leave("nobody"), Refused)
    assert refused.code == NODE_GONE and "may join it" in refused.message


# -- rule 7: join timeout ------------------------------------------------------------------------


def test_a_round_that_does_not_form_in_time_times_its_nodes_out_saying_how_far_it_got() -> None:
    s = Rdzv(min_nodes=2, max_nodes=2, join_timeout_s=10.0)
    s.at(0).node_join("a")
    for t in range(1, 10):
        s.at(t).keepalive("a")
    timed_out = one(s.at(10).tick(), NodeLeft)
    assert timed_out.how == "timed_out"
    assert "round 1 did not form within its join timeout of 10 s: 1/2 nodes" in timed_out.reason
    assert s.status()["waiting"] == [] and s.status()["live"] == []


# -- rule 8: leaving and closing -----------------------------------------------------------------


def test_a_close_tells_the_waiting_nodes_and_refuses_every_later_join() -> None:
    s = Rdzv()
    s.two_in_round_one()
    s.at(3).node_join("c")
    closed = one(s.at(4).close("a", "node a's run ended"), JobClosed)
    assert closed.round == 1
    status = s.status()
    assert status["closed"]["node"] == "a" and status["waiting"] == []
    refused = one(s.node_join("d"), Refused)
    assert refused.code == RENDEZVOUS_CLOSED
    assert "closed at offset" in refused.message and "new --rdzv-id" in refused.message
    assert one(s.keepalive("b"), Refused).code == RENDEZVOUS_CLOSED
    again = {"job": "job", "node": "b", "reason": "b's run ended"}
    assert s.m.repeat_of("rdzv_close", None, None, again) == closed.offset
    assert s.m.next_deadline() is None


# -- determinism, snapshots, rows ----------------------------------------------------------------


def _scenario(s: Rdzv) -> list[Any]:
    out: list[Any] = []
    out += s.at(0).node_join("a")
    out += s.at(0.5).node_join("b")
    out += s.at(2).tick()
    out += s.at(3).node_join("c")
    out += s.at(3.1).node_join("a", "nodes_waiting")
    out += s.at(3.2).keepalive("b")
    out += s.at(3.3).node_join("b", "nodes_waiting")
    out += s.at(4).node_join("b", "workers_failed", 1)
    out += s.at(5).keepalive("a")
    out += s.at(9).keepalive("b")
    out += s.at(10).tick()  # a and c lost: the round forms with b
    out += s.at(10).close("b")
    return out


def test_snapshot_and_tail_give_the_full_replay() -> None:
    full = Rdzv()
    effects = _scenario(full)
    assert [type(e) for e in effects].count(RoundFormed) == 3
    whole = Coordinator()
    per_record = [whole.step(rec) for rec in full.records]
    for cut in range(1, len(full.records)):
        part = Coordinator()
        for rec in full.records[:cut]:
            part.step(rec)
        data = msgspec.json.decode(msgspec.json.encode(part.snapshot()))
        resumed = Coordinator.from_snapshot(data)
        tail = [resumed.step(rec) for rec in full.records[cut:]]
        assert [encode(e) for e in tail] == [encode(e) for e in per_record[cut:]], cut
        assert resumed.snapshot() == whole.snapshot()


def test_every_effect_has_its_row() -> None:
    s = Rdzv()
    effects = _scenario(s)
    kinds = set()
    for effect in effects:
        if isinstance(effect, Refused):
            continue
        rows = ROWS[type(effect)](effect)
        kinds.update(r.kind for r in rows)
        assert all(r.group == "job" for r in rows)
    assert kinds == {"rdzv_job", "rdzv_round", "rdzv_node", "rdzv_closed"}
    seqs = [e.seq for e in effects if isinstance(e, NodeJoined | NodeLeft)]
    assert seqs == list(range(1, len(seqs) + 1))
