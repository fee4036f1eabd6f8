"""Hypothesis stateful tests: random streams of every input kind, invariants after every step.

After each step: versions rise by exactly one per commit; at most one change in flight per
group; a view that activates ranks was admitted only with every member HEALTHY and the active set
a clique of usable edges; the Healthy Set is a maximum clique (checked by brute force) whenever
no reconciliation window is open; every proposal gets exactly one terminal outcome and keeps it;
``check`` agrees with ``step``; snapshot + tail equals the full replay; two replays are
byte-identical.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from foldplane.coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    ProposalAccepted,
    ProposalResolved,
    Refused,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.wire.codes import (
    TERMINAL,
)
from tests.fold.script import S, Script

GROUPS = ("g", "h")
ranks_st = st.integers(min_value=0, max_value=9)  # mapped into the group by pick()
groups_st = st.integers(min_value=0, max_value=1)


def max_clique_size(candidates: list[int], down: set[frozenset[int]]) -> int:
    for k in range(len(candidates), 0, -1):
        for combo in itertools.combinations(candidates, k):
            if all(frozenset(p) not in down for p in itertools.combinations(combo, 2)):
                return k
    return 0


class FoldMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = Script()
        self.effects: list[list[Any]] = []  # per record, in order
        self.world: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        #: each group's last committed active ranks, as the effects so far say (one step may
        #: prepare and commit several views: a prepared view is checked against the one before)
        self.active: dict[str, set[int]] = {}
        self.in_flight: dict[str, int | None] = {}
        self.outcomes: dict[int, Any] = {}
        self.accepted: set[int] = set()
        self.snapshot: tuple[int, bytes] | None = None
        self.epoch = 0

    # ------------------------------------------------------------------ driving

    def feed(self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]) -> None:
        expected = self.s.m.check(kind, group, rank, payload) if kind != "tick" else None
        effects = self.s.record(kind, group, rank, payload)
        self.effects.append(effects)
        refused = [e for e in effects if isinstance(e, Refused)]
        if expected is None:
            assert refused == [], f"check() passed but step refused: {refused}"
        else:
            assert [r.code for r in refused] == [expected.code]
            assert len(effects) == 1
        self.observe(effects)

    def observe(self, effects: list[Any]) -> None:
        m = self.s.m
        for e in effects:
            if isinstance(e, ViewPrepare):
                # A change whose every new active rank left, with no live participant to commit
                # it for, is withdrawn (no effect); the next change prepares that version again.
                assert self.in_flight.get(e.group) in (None, e.version), "two changes in flight"
                assert e.version == self.committed.get(e.group, 0) + 1
                self.in_flight[e.group] = e.version
                self.check_admitted(e, self.active.get(e.group, set()))
            elif isinstance(e, ViewCommitted):
                v = e.view
                assert v.active_ranks, f"version {v.version} committed an empty view"
                assert self.in_flight.get(v.group) == v.version
                assert v.version == self.committed.get(v.group, 0) + 1
                self.committed[v.group] = v.version
                self.active[v.group] = set(v.active_ranks)
                self.in_flight[v.group] = None
            elif isinstance(e, ProposalAccepted):
                p = e.proposal
                if p.id in self.accepted:  # only a reconfigure's further member joins it
                    assert p.op == "reconfigure" and p.id not in self.outcomes
                    assert len(p.callers) == len(set(p.callers)) > 1
                self.accepted.add(p.id)
            elif isinstance(e, ProposalResolved):
                p = e.proposal
                assert p.id in self.accepted and p.id not in self.outcomes, "a second outcome"
                assert p.status in TERMINAL
                self.outcomes[p.id] = p
        for pid, p in self.outcomes.items():
            assert m.proposal(pid) == p, f"proposal {pid} changed after its outcome"
        for group, version in self.in_flight.items():
            if version is not None and m.group_status(group)["change_in_flight"] is None:
                self.in_flight[group] = None  # withdrawn (see above)

    def check_admitted(self, prep: ViewPrepare, old: set[int]) -> None:
        """``prep`` activates only HEALTHY ranks that form a clique, measured against ``old``,
        the view committed before it (not the fold's view after the step, which may already
        be a later one)."""
        status = self.s.m.group_status(prep.group)
        target = set(prep.active_ranks)
        ranks = status["ranks"]
        if target - old:  # the view activates ranks: formation or an activate proposal
            for r in target:
                assert ranks[r]["state"] == HEALTHY, f"rank {r} activated while {ranks[r]}"
                assert not set(ranks[r]["down_peers"]) & target, f"{target} is not a clique"
        if prep.cause["kind"] == "auto_deactivation":
            assert target < old and target <= set(status["healthy_set"])

    def pick(self, gi: int, rank: int) -> tuple[str, int]:
        """A created group and one of its ranks (streams about unknown ones are a rule of their own)."""
        groups = sorted(self.world)
        group = groups[gi % len(groups)]
        return group, rank % self.world[group]

    def payload(self, group: str, rank: int, **extra: Any) -> dict[str, Any]:
        return {"incarnation": self.s.inc(rank, group), **extra}

    # ------------------------------------------------------------------ rules

    @initialize(
        world=st.integers(min_value=2, max_value=5),
        config=st.fixed_dictionaries(
            {},
            optional={
                "min_ranks": st.integers(min_value=1, max_value=2),
                "max_failure": st.sampled_from([2, 3, "50%"]),
                "auto_deactivate_on_failure": st.booleans(),
                "backend": st.sampled_from(["gloo", "nccl"]),
                "reconcile_window_s": st.sampled_from([0, 0.25, 2.0]),
                "min_active": st.integers(min_value=1, max_value=2),
            },
        ),
        second=st.booleans(),
        formed=st.sampled_from([True, True, False]),
    )
    def create(self, world: int, config: dict[str, Any], second: bool, formed: bool) -> None:
        if isinstance(config.get("max_failure"), int):
            config["max_failure"] = min(world, config["max_failure"])
        config = dict(
            config,
            heartbeat_timeout_s=10,
            ack_timeout_s=20,
            admission_timeout_s=15,
            formation_timeout_s=60,
        )
        for group in GROUPS[: 1 + second]:
            self.world[group] = world
            self.feed("group_created", group, None, {"world_size": world, "config": config})
            if formed:  # most streams start from a formed group, so chaos meets a running job
                for rank in range(world):
                    self.bring_up(GROUPS.index(group), rank)
                self.ack_everyone(GROUPS.index(group), 0)

    @rule(gi=groups_st, rank=ranks_st, new=st.booleans())
    def join(self, gi: int, rank: int, new: bool) -> None:
        group, rank = self.pick(gi, rank)
        if new:
            self.epoch += 1
            self.s.incarnations[(group, rank)] = f"{group}-{rank}-{self.epoch}"
        self.feed("join", group, rank, self.payload(group, rank))

    @rule(gi=groups_st, rank=ranks_st, stale=st.booleans())
    def beat(self, gi: int, rank: int, stale: bool) -> None:
        group, rank = self.pick(gi, rank)
        payload = {"incarnation": "stale"} if stale else self.payload(group, rank)
        self.feed("heartbeat", group, rank, payload)

    @rule(
        gi=groups_st,
        rank=ranks_st,
        down=st.sets(ranks_st, max_size=3),
        ready=st.booleans(),
        hint=st.none() | st.lists(ranks_st, max_size=2),
    )
    def links(self, gi: int, rank: int, down: set[int], ready: bool, hint: Any) -> None:
        group, rank = self.pick(gi, rank)
        world = self.world.get(group, 5)
        peers = {str(p): "down" if p in down else "up" for p in range(world) if p != rank}
        payload = self.payload(group, rank, peers=peers, self_ready=ready)
        if hint is not None:
            payload["failed_ranks_hint"] = [h for h in hint if h < world]
        self.feed("links", group, rank, payload)

    @rule(gi=groups_st, rank=ranks_st, skew=st.sampled_from([0, 0, 0, 1, -1]))
    def ack(self, gi: int, rank: int, skew: int) -> None:
        group, rank = self.pick(gi, rank)
        status = self.s.m.group_status(group)
        change = status and status["change_in_flight"]
        version = (change["version"] if change else self.committed.get(group, 0)) + skew
        self.feed("ack", group, rank, self.payload(group, rank, version=max(0, version)))

    @rule(gi=groups_st, rank=ranks_st)
    def ack_everyone(self, gi: int, rank: int) -> None:
        group, rank = self.pick(gi, rank)
        status = self.s.m.group_status(group)
        if status and status["change_in_flight"]:
            change = status["change_in_flight"]
            for r in change["participants"]:
                if r not in change["acked"] and r not in change["dropped"]:
                    self.feed("ack", group, r, self.payload(group, r, version=change["version"]))

    @rule(gi=groups_st, rank=ranks_st)
    def exit(self, gi: int, rank: int) -> None:
        group, rank = self.pick(gi, rank)
        self.feed("exit", group, rank, self.payload(group, rank))

    @rule(gi=groups_st, rank=ranks_st, named=st.booleans())
    def death(self, gi: int, rank: int, named: bool) -> None:
        group, rank = self.pick(gi, rank)
        payload = self.payload(group, rank) if named else {"reporter": "launcher"}
        self.feed("death_reported", group, rank, payload)

    @rule(
        gi=groups_st,
        op=st.sampled_from(["activate", "deactivate"]),
        ranks=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3),
        key=st.none() | st.sampled_from(["k1", "k2"]),
    )
    def propose(self, gi: int, op: str, ranks: list[int], key: str | None) -> None:
        group, _ = self.pick(gi, 0)
        payload: dict[str, Any] = {"op": op, "ranks": ranks, "proposer": "test"}
        if key is not None:
            payload["idempotency_key"] = key
        self.feed("proposal", group, None, payload)

    @rule(
        gi=groups_st,
        odd=st.none() | st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=4),
        who=st.integers(min_value=0, max_value=5),
        uuid=st.integers(min_value=0, max_value=5),
        stale=st.sampled_from([False, False, False, True]),
        everyone=st.booleans(),
    )
    def reconfigure(
        self, gi: int, odd: list[int] | None, who: int, uuid: int, stale: bool, everyone: bool
    ) -> None:
        """One member's call of torch's reconfigure. Each uuid has its members (so the members'
        calls join and the view commits), unless ``odd`` names others (a conflict, ranks out of
        range or twice); few uuids, so they are reused; sometimes a handle of another
        incarnation, sometimes a caller left out; ``everyone``: each member calls in turn."""
        group, _ = self.pick(gi, 0)
        world = self.world[group]
        ranks = odd or [(uuid + i) % world for i in range(1 + uuid % world)][::-1]
        incarnations = [self.s.inc(r, group) for r in ranks]
        if stale:
            incarnations[-1] = "gone"
        callers = ranks if everyone else [ranks[who % len(ranks)] if who < 5 else who]
        for caller in callers:
            payload = {
                "op": "reconfigure",
                "ranks": ranks,
                "incarnations": incarnations,
                "uuid": uuid,
                "caller": caller,
                "call": f"{caller}-{who % 2}",
                "timeout_s": 5.0,
            }
            if self.s.m.repeat_of("proposal", group, None, payload) is None:
                self.feed("proposal", group, None, payload)

    @rule(gi=groups_st, rank=ranks_st)
    def bring_up(self, gi: int, rank: int) -> None:
        """A process starts (or comes back) and reports every link up: the common path."""
        group, rank = self.pick(gi, rank)
        info = self.s.m.group_status(group)["ranks"][rank]
        if info["state"] == OFFLINE and info["incarnation"] is not None:
            self.epoch += 1
            self.s.incarnations[(group, rank)] = f"{group}-{rank}-{self.epoch}"
        self.feed("join", group, rank, self.payload(group, rank))
        peers = {str(p): "up" for p in range(self.world[group]) if p != rank}
        self.feed("links", group, rank, self.payload(group, rank, peers=peers, self_ready=True))

    @rule(
        kind=st.sampled_from(["join", "heartbeat", "exit", "ack"]),
        where=st.sampled_from(["unknown group", "out of range", "no rank", "bad payload"]),
    )
    def stray(self, kind: str, where: str) -> None:
        """Inputs that must be refused: unknown group, rank out of range, malformed."""
        payload = {"incarnation": "x", "version": 1}
        if where == "unknown group":
            self.feed(kind, "nope", 0, payload)
        elif where == "out of range":
            self.feed(kind, "g", 7, payload)
        elif where == "no rank":
            self.feed(kind, "g", None, payload)
        else:
            self.feed(kind, "g", 0, {"incarnation": 12})

    @rule(dt=st.sampled_from([0.0, 0.1, 0.3, 2.5, 9.0, 16.0, 25.0]))
    def tick(self, dt: float) -> None:
        self.s.now += round(dt * S)
        self.feed("tick", None, None, {})

    @rule(dt=st.sampled_from([0.0, 60.0, 3_600.0]))
    def resume(self, dt: float) -> None:
        """The coordinator comes back after an outage of ``dt`` seconds."""
        self.s.now += round(dt * S)
        self.feed("tick", None, None, {"resumed": True})

    @rule()
    def take_snapshot(self) -> None:
        self.snapshot = (len(self.s.records), msgspec.json.encode(self.s.m.snapshot()))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def healthy_set_is_a_maximum_clique(self) -> None:
        m = self.s.m
        for group in m.groups():
            status = m.group_status(group)
            ranks = status["ranks"]
            hs = status["healthy_set"]
            assert hs == [r["rank"] for r in ranks if r["state"] == HEALTHY]
            if (
                status["reconcile_window_end_ts"] is not None
                or status["formation"]["status"] == "failed"
            ):
                continue
            candidates = [r["rank"] for r in ranks if r["state"] != OFFLINE and r["self_ready"]]
            down = {
                frozenset((r["rank"], p))
                for r in ranks
                if r["rank"] in candidates
                for p in r["down_peers"]
                if p in candidates
            }
            assert set(hs) <= set(candidates)
            assert not any(frozenset(p) in down for p in itertools.combinations(hs, 2))
            assert len(hs) == max_clique_size(candidates, down)

    @invariant()
    def next_deadline_is_never_in_the_past(self) -> None:
        if self.s.records and self.s.records[-1].kind == "tick":
            d = self.s.m.next_deadline()
            assert d is None or d > self.s.records[-1].ts

    @invariant()
    def snapshot_plus_tail_equals_full_replay(self) -> None:
        if self.snapshot is None:
            return
        at, data = self.snapshot
        restored = Coordinator.from_snapshot(json.loads(data))
        tail = [restored.step(rec) for rec in self.s.records[at:]]
        assert msgspec.json.encode(tail) == msgspec.json.encode(self.effects[at:])
        assert msgspec.json.encode(restored.snapshot()) == msgspec.json.encode(self.s.m.snapshot())
        assert restored.next_deadline() == self.s.m.next_deadline()
        for group in self.s.m.groups():
            assert restored.group_status(group) == self.s.m.group_status(group)

    def teardown(self) -> None:
        if not self.world:
            return
        # Far in the future every deadline has fired: every proposal has its outcome.
        for _ in range(4):
            self.tick(10_000.0)
        pending = sorted(self.accepted - set(self.outcomes))
        assert pending == [], f"proposals without an outcome: {pending}"
        replays = []
        for _ in range(2):
            fresh = Coordinator()
            effects = [fresh.step(rec) for rec in self.s.records]
            replays.append((msgspec.json.encode(effects), msgspec.json.encode(fresh.snapshot())))
        assert replays[0] == replays[1]
        assert replays[0][0] == msgspec.json.encode(self.effects)
        assert replays[0][1] == msgspec.json.encode(self.s.m.snapshot())


FoldMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFold = FoldMachine.TestCase


def test_a_tick_that_commits_two_views_is_checked_view_by_view() -> None:
    """A schedule the search found: every rank exits while a reconfigure waits, two deactivate
    proposals queue behind it; the tick that times the reconfigure out prepares and commits
    both views (nobody is left to ACK), so the first one, which removes rank 0 of the five,
    must be checked against the view before it, not against the second."""
    machine = FoldMachine()
    machine.create(world=5, config={}, second=False, formed=True)
    machine.reconfigure(gi=0, odd=None, who=0, uuid=0, stale=False, everyone=False)
    for rank in range(4):
        machine.exit(gi=0, rank=rank)
    machine.propose(gi=0, key=None, op="deactivate", ranks=[0])
    machine.propose(gi=0, key=None, op="deactivate", ranks=[1])
    machine.exit(gi=0, rank=4)
    machine.teardown()  # every proposal has its outcome, each view was checked
    assert machine.committed["g"] == 3 and machine.active["g"] == {2, 3, 4}
