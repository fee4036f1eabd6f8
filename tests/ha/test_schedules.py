"""The HA pair (or trio) on PostgreSQL through random schedules of SIGKILLs and SIGSTOPs.

Each schedule is drawn from a seed (``random.Random(seed)``): two or three real coordinator
processes on a fresh schema, a group of 8 to 16 simulated ranks (``agent.simhost``: the real
``AgentMachine`` per rank over both addresses) heartbeating every 100 ms, and a proposer that
deactivates and activates a rank again and again, so that faults land inside view changes,
proposal resolutions and projection writes. The faults, with random waits between them: SIGKILL
the leader, SIGKILL a standby, SIGSTOP the leader or a standby for a random time shorter or
longer than the lease (SIGCONT when it is up, while other faults go on), restart a killed node.
After the schedule every node runs again, and:

- every write a coordinator acknowledged (an event answered with an offset, a proposal id) is in
  the log at that offset with its content (a shared heartbeat record names the rank), and the
  log's offsets are gap-free;
- every record's term was claimed by exactly one node (its "leading at term T" line), terms
  never go back along the log, and a leader frozen past its term wrote nothing once a later term
  existed (the log's head read just before its SIGCONT bounds its records);
- the view history has no fork: versions 1, 2, 3, ... once each, every node serves the same
  history, and every view an agent installed is the committed view of its version;
- every answered proposal reaches a terminal outcome and keeps its id under its key;
- the agents converge on the last committed view, and ``python -m coordinator replay`` finds
  the projections equal to a fold from scratch.

A failing schedule prints a one-line reproduction: ``FOLDPLANE_HA_SEED=N`` runs that seed alone
(the fault list is a function of the seed; the timings of the processes are not).

The default run keeps one short schedule; the slow mark runs ``FOLDPLANE_HA_SCHEDULES`` (20)
seeds from ``FOLDPLANE_HA_SEED_BASE`` on.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from foldplane.agent.client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from foldplane.agent.simhost import SimulatedCluster
from foldplane.wire import ranks as rank_sets
from foldplane.wire.protocol import View
from tests.ha.cluster import LEASE_S, Node, fetch, replay, retrying, wait_for
from tests.ha.test_failover import Agents

#: Group settings of the failover suite: failures show within seconds, a failover trips none.
GROUP = {
    "heartbeat_timeout_s": 5.0,
    "ack_timeout_s": 10.0,
    "admission_timeout_s": 10.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.05,
}
#: Beats share a record for at most 50 ms, and snapshots are frequent: many writes to land in.
NODE_ARGS = ("--heartbeat-flush-s", "0.05", "--snapshot-every", "300")
#: How long a takeover, a restart or a convergence may take on a shared machine before the
#: schedule fails (the benchmark measures the real figures: ``python -m benchmarks failover``).
DEADLINE_S = 30.0
TERMINAL = {"applied", "applied_with_dropped_ranks", "rejected"}

SHORT_SEEDS = (1,)
FULL_COUNT = int(os.environ.get("FOLDPLANE_HA_SCHEDULES", "20"))
FULL_BASE = int(os.environ.get("FOLDPLANE_HA_SEED_BASE", "1000"))
ONE_SEED = os.environ.get("FOLDPLANE_HA_SEED")
#: Faults per schedule: the short one, the full ones (and one seed run alone).
SHORT_FAULTS, FULL_FAULTS = 3, 5
ONE_FAULTS = int(os.environ.get("FOLDPLANE_HA_FAULTS", str(FULL_FAULTS)))


# -- the schedule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One fault: after ``after_s`` seconds, ``action`` on the node that holds ``role`` then."""

    after_s: float
    action: str  # "kill", "stop" (SIGSTOP, SIGCONT after hold_s) or "restart"
    role: str  # "leader", "standby" or "killed"
    hold_s: float = 0.0

    def __str__(self) -> str:
        held = f" {self.hold_s:.2f}s" if self.action == "stop" else ""
        return f"+{self.after_s:.2f}s {self.action} {self.role}{held}"


@dataclass(frozen=True)
class Plan:
    seed: int
    coordinators: int
    world_size: int
    faults: tuple[Fault, ...]

    def __str__(self) -> str:
        faults = "; ".join(str(f) for f in self.faults)
        return f"{self.coordinators} coordinators, {self.world_size} ranks: {faults}"


def draw(seed: int, count: int) -> Plan:
    """A schedule of ``count`` faults, valid by construction: a kill always leaves one node
    that was not killed, a standby is asked for only when two nodes answer, a restart only
    when one is down."""
    rng = random.Random(seed)
    coordinators = rng.choice((2, 2, 3))
    world_size = rng.randint(8, 16)
    faults: list[Fault] = []
    now, killed, thaws, after = 0.0, 0, [0.0], 0.0
    while len(faults) < count:
        wait = rng.uniform(0.1, 2.5)
        now += wait
        after += wait
        frozen = sum(t > now for t in thaws)
        answering = coordinators - killed - frozen
        choices: list[tuple[str, str]] = []
        if answering >= 1 and coordinators - killed >= 2:
            choices += [("kill", "leader")] * 2
        if answering >= 2 and coordinators - killed >= 2:
            choices.append(("kill", "standby"))
        if answering >= 1:
            choices += [("stop", "leader")] * 2
        if answering >= 2:
            choices.append(("stop", "standby"))
        if killed:
            choices += [("restart", "killed")] * 2
        if not choices:
            continue  # everything is frozen: wait for a SIGCONT
        action, role = rng.choice(choices)
        hold = 0.0
        if action == "stop":  # shorter than the lease, or long past it
            hold = LEASE_S * (rng.uniform(0.2, 0.7) if rng.random() < 0.4 else rng.uniform(1.3, 3))
            thaws.append(now + hold)
        killed += {"kill": 1, "restart": -1}.get(action, 0)
        faults.append(Fault(round(after, 2), action, role, round(hold, 2)))
        after = 0.0
    return Plan(seed, coordinators, world_size, tuple(faults))


class Faults:
    """Carries out a plan on the nodes, resolving each role when its fault is due; remembers
    what it did (for the reproduction) and what a frozen leader may not have written."""

    def __init__(self, nodes: list[Node], schema: str) -> None:
        self.nodes = nodes
        self.schema = schema
        self.killed: set[int] = set()
        self.frozen: dict[int, int | None] = {}  # node -> the term it led when frozen
        #: (term, seq): no record of that term at or after that offset (a frozen leader's)
        self.fences: list[tuple[int, int]] = []
        self.done: list[str] = []
        self._thaws: list[tuple[float, int]] = []

    def run(self, plan: Plan) -> None:
        for fault in plan.faults:
            self._until(time.monotonic() + fault.after_s)
            self._apply(fault)
        self._until(math.inf)
        for i in sorted(self.killed):
            self.nodes[i].start()
            self.done.append(f"restart node {i} (end)")
        self.killed.clear()

    def _until(self, when: float) -> None:
        """Let the load run until ``when``, resuming each frozen node at its time."""
        while self._thaws and self._thaws[0][0] <= when:
            at, i = heapq.heappop(self._thaws)
            time.sleep(max(0.0, at - time.monotonic()))
            self._thaw(i)
        if when != math.inf:
            time.sleep(max(0.0, when - time.monotonic()))

    def _answering(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if i not in self.killed | set(self.frozen)]

    def _find(self, role: str) -> tuple[int, dict[str, Any]] | None:
        """The running, unfrozen node in ``role``, waiting out a takeover or a start (a
        liveness check: one emerges within the deadline); None when no node runs."""

        def look() -> tuple[int, dict[str, Any]] | None:
            for i in self._answering():
                health = self.nodes[i].health(timeout=1.0)
                if health and health.get("status") == "ok" and health.get("role") == role:
                    return i, health
            return None

        if not self._answering():
            return None  # the plan's model and the run parted (a restart still starting)
        return wait_for(look, DEADLINE_S, f"a {role} among the running nodes", step=0.05)

    def _apply(self, fault: Fault) -> None:
        if fault.action == "restart":
            if not self.killed:  # the kill before it found no node in its role
                self.done.append("restart: none killed")
                return
            i = min(self.killed)
            self.nodes[i].start()  # on its port: the agents and the operator know it there
            self.killed.discard(i)
            self.done.append(f"restart node {i}")
            return
        found = self._find(fault.role)
        if found is None:
            self.done.append(f"{fault.action} {fault.role}: none found")
            return
        i, health = found
        if fault.action == "kill":
            self.nodes[i].kill()
            self.killed.add(i)
            self.done.append(f"kill node {i} ({fault.role}, term {health['term']})")
        else:
            self.nodes[i].freeze()
            self.frozen[i] = health["term"] if fault.role == "leader" else None
            heapq.heappush(self._thaws, (time.monotonic() + fault.hold_s, i))
            self.done.append(f"stop node {i} ({fault.role}, term {health['term']})")

    def _thaw(self, i: int) -> None:
        term = self.frozen.pop(i)
        head = asyncio.run(fetch(self.schema, "SELECT term, next_seq FROM log_head"))[0]
        fenced = ""
        if term is not None and head["term"] > term:
            self.fences.append((term, head["next_seq"]))
            fenced = f", term {term} fenced from offset {head['next_seq']}"
        self.nodes[i].resume()
        self.done.append(f"cont node {i} (head term {head['term']}{fenced})")


# -- the load -------------------------------------------------------------------------------------


class InstallingAgents(Agents):
    """:class:`Agents` that also keep every view each rank installed, whole."""

    def __init__(self, addresses: list[Node], group: str, world_size: int) -> None:
        self.installed: dict[int, list[View]] = {r: [] for r in range(world_size)}
        super().__init__(addresses, group, world_size)

    async def _record(self, cluster: SimulatedCluster) -> None:
        def note() -> bool:  # called on every view installed
            for rank, views in self.installed.items():
                view = cluster.view(rank)
                if view is not None and (not views or views[-1] != view):
                    views.append(view)
            return False

        await cluster.wait_until(note, timeout=3600)

    def views_now(self) -> dict[int, View | None]:
        async def read() -> dict[int, View | None]:
            return {r: self.cluster.view(r) for r in self.cluster.live_ranks}

        return self.run(read())


class Proposer:
    """Deactivates and activates one rank, again and again, each proposal under its own
    idempotency key, resent with it after a failover; keeps every answer it got."""

    def __init__(self, urls: list[str], group: str, rank: int) -> None:
        self.client = CoordinatorClient(urls, timeout_s=2.0)
        self.group, self.rank = group, rank
        self.bodies: dict[str, dict[str, Any]] = {}
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(timeout=DEADLINE_S)
        assert not self._thread.is_alive(), "the proposer did not stop"

    def _call(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        try:
            return call()
        except CoordinatorUnavailable:
            return None  # a leadership change: resend under the same key
        except CoordinatorError as exc:
            if exc.status != 503:  # a node starting or stepping down says 503; nothing else may
                self.errors.append(str(exc))
            return None

    def _run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            key = f"p-{n}"
            body = {
                "group": self.group,
                "op": "deactivate" if n % 2 else "activate",
                "ranks": [self.rank],
                "idempotency_key": key,
            }
            self.bodies[key] = body
            answers = self.answers.setdefault(key, [])
            while not self.stopping.is_set():
                answer = self._call(
                    lambda b=body: self.client.request(
                        "POST", "/proposals", params={"wait": 2.0}, json=b, timeout_s=4.0
                    )
                )
                while answer is not None:
                    answers.append(answer)
                    if answer["status"] in TERMINAL or self.stopping.wait(0.1):
                        break
                    answer = self._call(lambda a=answer: self.client.proposal(int(a["id"])))
                if answers and answers[-1]["status"] in TERMINAL:
                    break
                self.stopping.wait(0.05)
            self.stopping.wait(0.3)


# -- the checks -----------------------------------------------------------------------------------


def _leader(nodes: list[Node]) -> Node:
    def look() -> Node | None:
        for node in nodes:
            health = node.health(timeout=1.0)
            if health and health.get("role") == "leader":
                return node
        return None

    return wait_for(look, DEADLINE_S, "a leader", step=0.05)


def _check_acknowledged(
    acked: list[tuple[Mapping[str, Any], Mapping[str, Any]]],
    log: dict[int, dict[str, Any]],
    world_size: int,
) -> None:
    assert {e["type"] for e, _ in acked} >= {"join", "links", "ack", "heartbeat"}
    for event, result in acked:
        record = log.get(result["offset"])
        assert record is not None, f"acknowledged {event} at {result['offset']}: not in the log"
        assert record["kind"] == event["type"], (event, record)
        if event["type"] == "heartbeat":  # a shared record naming every rank in it
            assert record["rank"] is None, record
            assert event["rank"] in rank_sets.decode(record["payload"]["ranks"], world_size)
        else:
            assert record["rank"] == event["rank"], (event, record)
            assert record["payload"]["incarnation"] == event["incarnation"], (event, record)


def _check_proposals(proposer: Proposer, leader: Node, log: dict[int, dict[str, Any]]) -> None:
    assert not proposer.errors, proposer.errors
    answered = {k: a for k, a in proposer.answers.items() if a}
    assert len(answered) >= 2, "too few proposals answered under the faults"
    for key, answers in answered.items():
        body = proposer.bodies[key]
        ids = {a["id"] for a in answers}
        assert len(ids) == 1, f"{key} got several ids: {answers}"
        record = log.get(ids.pop())
        assert record is not None and record["kind"] == "proposal", (key, record)
        for field in ("op", "ranks", "idempotency_key"):
            assert record["payload"][field] == body[field], (key, record)
        terminal = [a for a in answers if a["status"] in TERMINAL]
        assert all(a == terminal[0] for a in terminal), f"{key} changed after its outcome"
        final = wait_for(
            lambda a=answers[0]: (
                (p := leader.get(f"/proposals/{a['id']}"))["status"] in TERMINAL and p
            ),
            DEADLINE_S,
            f"proposal {key} to reach an outcome",
            step=0.1,
        )
        if terminal:
            assert final == terminal[0], (key, final, terminal[0])


def _check_terms(
    rows: list[Mapping[str, int]], led: list[list[int]], fences: list[tuple[int, int]]
) -> None:
    """``rows``: the log's (seq, term); ``led``: the terms each node took."""
    claims = sorted(t for terms in led for t in terms)
    assert len(claims) == len(set(claims)), f"a term led twice: {led}"
    terms = [r["term"] for r in rows]
    assert terms == sorted(terms), "a term went back along the log"
    assert set(terms) <= set(claims), f"records of terms no node led: {set(terms) - set(claims)}"
    for term, seq in fences:
        late = [r["seq"] for r in rows if r["term"] == term and r["seq"] >= seq]
        assert not late, f"the leader of term {term}, deposed while frozen, wrote {late}"


def _converge(agents: InstallingAgents, leader: Node, group: str) -> dict[str, Any]:
    """Wait until every live rank holds the leader's current view, and it stays current."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        current = leader.get("/views/current", group=group)
        agents.wait_version(current["version"], max(1.0, deadline - time.monotonic()))
        held = {r: v.version if v else None for r, v in agents.views_now().items()}
        still = leader.get("/views/current", group=group)["version"] == current["version"]
        if set(held.values()) == {current["version"]} and still:
            return current
        assert time.monotonic() < deadline, f"no convergence on {current['version']}: {held}"


def run_schedule(plan: Plan, nodes: Callable[..., Node], schema: str) -> None:
    group = "sched"
    cluster = [nodes(*NODE_ARGS) for _ in range(plan.coordinators)]
    cluster[0].start().wait_ready()
    cluster[0].wait_role("leader")
    for node in cluster[1:]:
        node.start()
    for node in cluster[1:]:
        assert node.wait_ready()["role"] == "standby"
    operator = CoordinatorClient([n.url for n in cluster], timeout_s=2.0)
    retrying(lambda: operator.create_group(group, plan.world_size, **GROUP))
    agents = InstallingAgents(cluster, group, plan.world_size)
    proposer = Proposer([n.url for n in cluster], group, plan.world_size - 1)
    faults = Faults(cluster, schema)
    try:
        agents.wait_version(1, DEADLINE_S)
        proposer.start()
        faults.run(plan)
        for node in cluster:
            node.wait_ready(DEADLINE_S)
        leader = _leader(cluster)
        after_faults = len(agents.sent())
        wait_for(
            lambda: len(agents.acked(after_faults)) > 10, DEADLINE_S, "writes after the faults"
        )
        proposer.stop()
        current = _converge(agents, leader, group)
        history = leader.views(group)  # before the agents stop beating and time out
        stopped = agents.cluster.stopped
    finally:
        print(f"carried out: {'; '.join(faults.done)}")
        proposer.stopping.set()
        agents.stop()
    assert not stopped, f"agents gave up: {stopped}"

    # Every acknowledged write is in the log at its offset, with its content; no gaps.
    log = {e["offset"]: e for e in leader.events()}
    assert sorted(log) == list(range(1, len(log) + 1)), "offsets are gap-free"
    acked = agents.acked()
    assert len(acked) > 50, "too few writes acknowledged under the faults"
    _check_acknowledged(acked, log, plan.world_size)
    _check_proposals(proposer, leader, log)

    # One history: versions once each and in order, served alike by every node, installed
    # by every agent only as committed.
    assert [v["version"] for v in history] == list(range(1, len(history) + 1)), history
    assert history[-1]["version"] == current["version"]
    head = leader.health()["head"]
    for node in cluster:
        wait_for(lambda n=node: n.health()["fold_offset"] >= head, DEADLINE_S, f"{node.url} folds")
        served = node.views(group)
        assert served[: len(history)] == history, f"{node.url} serves another history"
    committed = {v["version"]: v for v in history}
    for rank, views in agents.installed.items():
        versions = [v.version for v in views]
        assert versions == sorted(set(versions)), f"rank {rank} went back: {versions}"
        for view in views:
            doc = msgspec.json.decode(msgspec.json.encode(view))
            want = committed.get(view.version)
            assert want is not None, f"rank {rank} installed uncommitted version {view.version}"
            for field in ("active_ranks", "offset", "cause", "dropped_ranks", "acked_ranks"):
                assert doc[field] == want[field], (rank, field, doc, want)

    # Then stop every node and read the ground truth: terms, fences, and a fold from scratch.
    stopping = [threading.Thread(target=node.stop) for node in cluster]
    for thread in stopping:
        thread.start()
    for thread in stopping:
        thread.join()
    rows = asyncio.run(fetch(schema, "SELECT seq, term FROM log ORDER BY seq"))
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "offsets are gap-free"
    assert len(rows) >= len(log)
    _check_terms(rows, [n.terms_led() for n in cluster], faults.fences)
    checked = replay(schema)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _seeds() -> list[Any]:
    if ONE_SEED is not None:
        return [pytest.param(int(ONE_SEED), ONE_FAULTS, id=f"seed-{ONE_SEED}")]
    short = [pytest.param(s, SHORT_FAULTS, id=f"short-{s}") for s in SHORT_SEEDS]
    full = [
        pytest.param(s, FULL_FAULTS, id=f"full-{s}", marks=[pytest.mark.slow])
        for s in range(FULL_BASE, FULL_BASE + FULL_COUNT)
    ]
    return short + full


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("seed", "count"), _seeds())
def test_schedule(seed: int, count: int, nodes: Callable[..., Node], schema: str) -> None:
    plan = draw(seed, count)
    print(f"schedule seed {seed}: {plan}")
    try:
        run_schedule(plan, nodes, schema)
    except BaseException:
        print(
            f"reproduce: FOLDPLANE_HA_SEED={seed} FOLDPLANE_HA_FAULTS={count} "
            f"python -m pytest -q tests/ha/test_schedules.py  # {plan}"
        )
        raise


# -- the checks catch what they are for (no database) ---------------------------------------------


def test_a_schedule_is_a_function_of_its_seed_and_valid() -> None:
    for seed in range(500):
        plan = draw(seed, 6)
        assert plan == draw(seed, 6)
        killed = 0
        for fault in plan.faults:
            killed += {"kill": 1, "restart": -1}.get(fault.action, 0)
            assert 0 <= killed < plan.coordinators, plan  # one node is always left to lead
            assert (fault.hold_s > 0) == (fault.action == "stop"), plan
    kinds = {(f.action, f.role) for seed in range(50) for f in draw(seed, 6).faults}
    assert kinds == {
        ("kill", "leader"),
        ("kill", "standby"),
        ("stop", "leader"),
        ("stop", "standby"),
        ("restart", "killed"),
    }
    holds = [f.hold_s for seed in range(50) for f in draw(seed, 6).faults if f.hold_s]
    assert min(holds) < LEASE_S < max(holds)  # freezes shorter and longer than the lease


def test_the_term_check_catches_a_deposed_writer() -> None:
    rows = [{"seq": 1, "term": 1}, {"seq": 2, "term": 1}, {"seq": 3, "term": 2}]
    _check_terms(rows, [[1], [2]], [(1, 3)])
    with pytest.raises(AssertionError, match="went back"):
        _check_terms([*rows, {"seq": 4, "term": 1}], [[1], [2]], [])
    with pytest.raises(AssertionError, match="deposed while frozen"):
        _check_terms(rows, [[1], [2]], [(1, 2)])
    with pytest.raises(AssertionError, match="no node led"):
        _check_terms(rows, [[1], []], [])
    with pytest.raises(AssertionError, match="led twice"):
        _check_terms(rows, [[1, 2], [2]], [])


def test_the_audit_catches_a_lost_or_changed_write() -> None:
    def event(kind: str, rank: int) -> dict[str, Any]:
        return {"type": kind, "rank": rank, "incarnation": f"i{rank}"}

    acked = [(event(k, 1), {"offset": o}) for o, k in enumerate(("join", "links", "ack"), 1)]
    acked.append((event("heartbeat", 1), {"offset": 4}))
    log = {
        o: {"kind": k, "rank": 1, "payload": {"incarnation": "i1"}}
        for o, k in enumerate(("join", "links", "ack"), 1)
    }
    log[4] = {"kind": "heartbeat", "rank": None, "payload": {"ranks": rank_sets.encode([1])}}
    _check_acknowledged(acked, log, 4)
    with pytest.raises(AssertionError, match="not in the log"):
        _check_acknowledged(acked, {o: r for o, r in log.items() if o != 2}, 4)
    other = {**log, 3: {"kind": "ack", "rank": 2, "payload": {"incarnation": "i2"}}}
    with pytest.raises(AssertionError):
        _check_acknowledged(acked, other, 4)
    beat = {
        **log,
        4: {"kind": "heartbeat", "rank": None, "payload": {"ranks": rank_sets.encode([2])}},
    }
    with pytest.raises(AssertionError):
        _check_acknowledged(acked, beat, 4)
