"""The simulator's suites: many seeds, determinism, coverage, and a twin per invariant.

- ``test_seeds`` runs 1,000 seeds of ``HORIZON_STEPS`` steps each (split over two worker
  processes); a failing seed is reported with its one-line reproduction and a shrunk schedule.
  ``test_more_seeds`` (slow) runs the next 6,000. A seed costs about 35 ms of CPU: the default
  suite's thousand take half a minute of the CI machine's two cores.
- ``test_the_cluster_converges_once_the_faults_stop``: 100 seeds (400 more in the slow
  suite) run a minute of simulated quiet after their faults; every running agent must then
  hold the current view.
- ``test_a_seed_replays_exactly``: the same seed gives the same log, byte for byte.
- ``test_the_seeds_reach_the_faults``: the runs really contain what they claim (views beyond
  formation, coordinator restores, replacements, shutdowns, every proposal outcome...).
- ``test_a_broken_host_is_caught``: a host whose log forgets the last record on a crash, and
  one that restores without the log's tail, are caught, and their failure shrinks;
  ``test_a_broken_fold_is_caught``: four broken folds (a clean exit counted as a failure, no
  admission check, dropped ranks forgotten at the commit, a snapshot that loses a rank's exit)
  are each caught by the invariant that states what they break.
- ``test_twin_*``: each invariant fed a deliberately broken history raises its Violation, so
  none of the checks is vacuous.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from typing import Any

import msgspec
import pytest

from foldplane.coordinator.fold import machine as machine_module
from foldplane.coordinator.fold import ranks
from foldplane.coordinator.fold.barrier import ViewChange
from foldplane.coordinator.fold.config import GroupConfig
from foldplane.coordinator.fold.effects import (
    Effect,
    GroupCreated,
    Proposal,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.state import RankInfo
from foldplane.eventlog.record import Record
from foldplane.facets.epochs.cursor import ReadCursor
from foldplane.facets.epochs.effects import AssignmentChanged, EpochCompleted
from foldplane.facets.epochs.fold import Epochs
from foldplane.facets.epochs.inputs import EpochPlan
from foldplane.facets.epochs.sim import NAMES as EPOCH_NAMES
from foldplane.facets.epochs.sim import EpochChecks
from foldplane.facets.epochs.state import Epoch, Holding
from foldplane.sim import world as sim
from foldplane.sim.invariants import NAMES, Invariants, Violation
from foldplane.sim.world import HORIZON_STEPS, World, describe, run_seed, shrink
from foldplane.wire.protocol import View

SEEDS = 1_000
SLOW_SEEDS = 6_000
#: Seeds run with a quiet phase after their faults, and how long it lasts (simulated seconds).
CONVERGE_SEEDS = 100
SLOW_CONVERGE_SEEDS = 400
QUIET_S = 60.0


def _run_range(bounds: tuple[int, int]) -> list[tuple[int, int, str]]:
    failures = []
    for seed in range(*bounds):
        failure = run_seed(seed, HORIZON_STEPS)
        if failure is not None:
            failures.append((seed, failure.steps, str(failure.violation)))
    return failures


def _run_seeds(first: int, count: int) -> None:
    workers = max(1, min(2, os.cpu_count() or 1))
    chunk = 250
    ranges = [(s, min(s + chunk, first + count)) for s in range(first, first + count, chunk)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        failed = [f for part in pool.imap_unordered(_run_range, ranges) for f in part]
    if failed:
        failed.sort()
        seed, _, _ = failed[0]
        again = run_seed(seed, HORIZON_STEPS)
        assert again is not None, f"seed {seed} failed in a worker but not again: {failed[0]}"
        lines = [f"{len(failed)} of {count} seeds broke an invariant:", describe(again)]
        lines += [f"seed {s} (step {n}): {v}" for s, n, v in failed[1:20]]
        pytest.fail("\n".join(lines))


@pytest.mark.timeout(300)
def test_seeds() -> None:
    _run_seeds(0, SEEDS)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_more_seeds() -> None:
    _run_seeds(SEEDS, SLOW_SEEDS)


def _converge(seeds: range) -> None:
    settled = 0
    for seed in seeds:
        w = World(seed, HORIZON_STEPS)
        try:
            w.run(quiet_s=QUIET_S)
        except Violation as v:
            failure = sim.Failure(seed, w.step, None, v)
            pytest.fail(
                f"{describe(failure)}\n(with the quiet phase: World(seed).run(quiet_s={QUIET_S}))"
            )
        settled += w.settled
    assert settled >= len(seeds) // 3, f"only {settled} of {len(seeds)} seeds settled"


def test_the_cluster_converges_once_the_faults_stop() -> None:
    _converge(range(CONVERGE_SEEDS))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_more_seeds_converge() -> None:
    _converge(range(CONVERGE_SEEDS, CONVERGE_SEEDS + SLOW_CONVERGE_SEEDS))


def test_a_seed_replays_exactly() -> None:
    for seed in (1, 10, 11):
        a, b = World(seed, HORIZON_STEPS).run(), World(seed, HORIZON_STEPS).run()
        assert len(a.log) > 20
        assert msgspec.json.encode(a.log) == msgspec.json.encode(b.log)
        assert a.inv.effects == b.inv.effects
        assert a.stopped == b.stopped


def test_a_shorter_run_is_a_prefix_of_the_longer_one() -> None:
    """``--steps`` cuts the same run short (the schedule does not depend on it)."""
    long, short = World(10, HORIZON_STEPS).run(), World(10, 200).run()
    assert 20 < len(short.log) < len(long.log)
    assert msgspec.json.encode(short.log) == msgspec.json.encode(long.log[: len(short.log)])


def test_the_seeds_reach_the_faults() -> None:
    seen: Counter[str] = Counter()
    for seed in range(300):
        w = World(seed, HORIZON_STEPS).run()
        g = w.inv.groups[sim.GROUP]
        seen["views"] += g.last_version
        seen["views beyond formation"] += g.last_version > 1
        seen["coordinator restores"] += w.coord_epoch - 1
        seen["restores with a tail"] += w.coord_epoch > 1 and w.snapshot is not None
        seen["replacements"] += w.incarnations > w.setup.ranks
        seen["zombies"] += len(w.zombies)
        seen["resyncs"] += w.resyncs
        seen["failures counted"] += len(g.counted)
        seen["shutdowns"] += g.shutdown is not None
        seen["formation failed"] += g.failed
        kinds = Counter(r.kind for r in w.log)
        for kind in ("death_reported", "exit", "tick", "proposal", "ack", "links"):
            seen[f"record {kind}"] += kinds[kind] > 0
        seen["shared heartbeats"] += any(
            r.kind == "heartbeat" and len(r.payload["ranks"]) > 1 for r in w.log
        )
        for p in w.inv.proposals.values():
            seen[f"proposal {p.status}"] += 1
        for _, _, reason in w.stopped:
            seen[f"agent {reason}"] += 1
        seen["down evidence"] += any(r.kind == "links" and "down" in r.payload for r in w.log)
        seen["record epoch_plan"] += kinds["epoch_plan"] > 0
        seen["record progress"] += kinds["progress"] > 0
        seen["reassignments"] += any(f.kind == "reassign" for f in w.faults)
        for effect in _epoch_effects(w.log):
            if isinstance(effect, AssignmentChanged):
                seen[f"ranges moved by {effect.cause}"] += 1
            else:
                seen["epochs completed"] += 1
    wanted = [
        "views beyond formation",
        "coordinator restores",
        "restores with a tail",
        "replacements",
        "zombies",
        "resyncs",
        "failures counted",
        "shutdowns",
        "formation failed",
        "record death_reported",
        "record exit",
        "record proposal",
        "shared heartbeats",
        "proposal applied",
        "proposal rejected",
        "proposal applied_with_dropped_ranks",
        "agent closed",
        "agent fenced",
        "down evidence",
        "record epoch_plan",
        "record progress",
        "reassignments",
        "ranges moved by view_committed",
        "ranges moved by reclaim",
        "epochs completed",
    ]
    missing = [name for name in wanted if seen[name] == 0]
    assert not missing, f"no seed of 300 reached {missing}: {dict(seen)}"


def _epoch_effects(log: list[Record]) -> list[Effect]:
    fold = machine_module.Coordinator()
    return [
        e
        for rec in log
        for e in fold.step(rec)
        if isinstance(e, AssignmentChanged | EpochCompleted)
    ]


# -- the simulator catches a broken host -----------------------------------------------------


class _LosesLastRecord(World):
    """A host whose log forgets the newest record when the coordinator crashes."""

    def crash_now(self) -> None:
        if self.coord is not None and self.log:
            self.log.pop()
            self.projected = min(self.projected, len(self.log))
            self.snapshot = None
        super().crash_now()


class _ForgetsTheTail(World):
    """A host that restores from its snapshot and skips the records after it."""

    def start_coordinator(self) -> None:
        if self.snapshot is not None:
            kept = self.log
            self.log = kept[: msgspec.json.decode(self.snapshot)["fold"]["offset"]]
            super().start_coordinator()
            self.log = kept
            assert self.coord is not None
            self.coord.applied = len(kept)
        else:
            super().start_coordinator()


@pytest.mark.parametrize(
    ("broken", "expected"),
    [(_LosesLastRecord, {"log_gap_free_and_kept"}), (_ForgetsTheTail, None)],
)
def test_a_broken_host_is_caught(
    monkeypatch: pytest.MonkeyPatch, broken: Any, expected: Any
) -> None:
    monkeypatch.setattr(sim, "World", broken)
    found = None
    for seed in range(200):
        w = broken(seed, HORIZON_STEPS)
        try:
            w.run()
        except Violation as v:
            found = sim.Failure(seed, w.step, None, v)
            break
    assert found is not None, f"{broken.__name__} went unnoticed for 200 seeds"
    if expected is not None:
        assert found.violation.name in expected
    small = shrink(found)
    assert small.steps <= found.steps and small.keep is not None
    assert len(small.keep) <= len(sim.setup(found.seed).faults)
    assert small.reproduction().startswith(f"python -m tests.sim --seed {found.seed} --steps ")
    again = run_seed(found.seed, small.steps, set(small.keep))
    assert again is not None and again.violation.name == found.violation.name


# -- the simulator catches a broken fold -------------------------------------------------------


def _exit_counted(g: Any, record: Any, exit: Any, now: int) -> tuple[Any, ...]:
    """A clean exit taken down the death chain as a failure (before it is marked exited)."""
    rank = record.rank
    if g.ranks[rank].state == "OFFLINE":
        return (ranks.Exited(rank),)
    return ranks.Lost(rank, "exited cleanly", True), ranks.Exited(rank)


_commit = ViewChange.commit


def _drops_forgotten(self: Any, g: Any, record: Any) -> list[Any]:
    """A commit that forgets which participants were dropped."""
    g.change.dropped.clear()
    return _commit(self, g, record)


_to_list = RankInfo.to_list


def _snapshot_loses_exited(self: Any) -> list[Any]:
    """A snapshot that does not keep whether a rank exited."""
    data = _to_list(self)
    data[4] = False
    return data


_view_committed = Epochs.view_committed


def _leavers_keep_their_work(self: Any, *args: Any) -> None:
    """A view change that leaves a departed rank's remainder with it."""


def _leavers_forget_progress(
    self: Any, fold: Any, g: Any, view: Any, base: Any, record: Any, effects: Any
) -> None:
    """A view change that hands out again what a departed rank had processed."""
    ge = self._groups.get(g.name)
    e = None if ge is None else ge.current
    if e is not None and e.completed is None:
        for r, h in e.holdings.items():
            if not view.is_active(r) and h.processed:
                e.unprocessed += h.processed
                h.processed = 0
    _view_committed(self, fold, g, view, base, record, effects)


@pytest.mark.parametrize(
    ("target", "attr", "broken", "expected"),
    [
        (ranks, "on_exit", _exit_counted, "clean_exit_not_failure"),
        (machine_module, "admission_problem", lambda g, t: None, "activation_healthy_clique"),
        (ViewChange, "commit", _drops_forgotten, "members_acked_or_dropped"),
        (RankInfo, "to_list", _snapshot_loses_exited, "replay_identical"),
        (Epochs, "view_committed", _leavers_keep_their_work, "epoch_exactly_once"),
        (Epochs, "view_committed", _leavers_forget_progress, "epoch_exactly_once"),
    ],
    ids=[
        "exit-counted",
        "no-admission",
        "drops-forgotten",
        "snapshot-loses-exited",
        "leavers-keep-work",
        "leavers-forget-progress",
    ],
)
def test_a_broken_fold_is_caught(
    monkeypatch: pytest.MonkeyPatch, target: Any, attr: str, broken: Any, expected: str
) -> None:
    monkeypatch.setattr(target, attr, broken)
    for seed in range(300):
        w = World(seed, HORIZON_STEPS)
        try:
            w.run()
        except Violation as v:
            assert v.name == expected, v
            return
    pytest.fail(f"the broken {attr} went unnoticed for 300 seeds")


# -- the simulator catches a reader that counts a late mark --------------------------------------


def _follow_without_cuts(self: Any, old_base: Any, old: Any, new_base: Any, new: Any) -> None:
    """A reader's count that ignores a part taken from under it (the sampler before reports
    were bound to their part): what it read of an old share is counted against the new one."""
    self.advance(new_base)


def test_a_reader_that_credits_a_late_mark_to_a_new_share_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The generated reassignments (a rank deactivated while it reads, activated again a
    little later) catch the bug of docs/data.md's exactly-once promise within a few hundred of
    the seeds that have one."""
    monkeypatch.setattr(ReadCursor, "follow", _follow_without_cuts)
    tried = 0
    for seed in range(3000):
        if not any(f.kind == "reassign" for f in sim.setup(seed).faults):
            continue
        tried += 1
        try:
            World(seed, HORIZON_STEPS).run()
        except Violation as v:
            assert v.name == "epoch_counted_unread", v
            return
    pytest.fail(f"the reader that credits late marks went unnoticed for {tried} seeds")


# -- twins: every invariant can fail -----------------------------------------------------------


class History:
    """A hand-written history fed to :class:`Invariants` the way the simulator feeds it."""

    def __init__(self, world_size: int = 3, max_failure: int | None = None) -> None:
        self.inv = Invariants()
        #: the epochs facet's invariants (its part of the simulator), fed the same history
        self.epochs = EpochChecks()
        self.log: list[Record] = []
        config = GroupConfig.from_request({"world_size": world_size, "max_failure": max_failure})
        self.record("group_created", None, {}, [GroupCreated(group="g", config=config, offset=1)])

    @property
    def offset(self) -> int:
        return len(self.log) + 1

    def record(
        self, kind: str, rank: int | None, payload: dict[str, Any], effects: list[Effect]
    ) -> Record:
        rec = Record(self.offset, self.offset, 1, kind, "g", rank, payload, 0)
        self.log.append(rec)
        self.inv.check_log_gap_free_and_kept(self.log, [])
        self.inv.on_record(rec, effects)
        return rec

    def state(self, rank: int, state: str, reason: str = "", inc: str | None = None) -> RankState:
        return RankState(
            group="g",
            rank=rank,
            state=state,
            incarnation=inc or f"i{rank}",
            rank_epoch=1,
            reason=reason,
            offset=self.offset,
        )

    def join_ready(self, *ranks: int) -> None:
        for r in ranks:
            self.record("join", r, {"incarnation": f"i{r}"}, [self.state(r, "SYNCED")])
            self.record(
                "links", r, {"incarnation": f"i{r}", "self_ready": True}, [self.state(r, "HEALTHY")]
            )

    def prepare(self, version: int, active: tuple[int, ...], kind: str = "formation", **kw: Any):
        p = ViewPrepare(
            group="g",
            version=version,
            active_ranks=active,
            participants=kw.get("participants", active),
            ack_deadline_ts=0,
            cause={"kind": kind, "proposals": kw.get("proposals", []), "detail": ""},
            offset=self.offset,
        )
        self.record("tick", None, {}, [p])
        return p

    def ack(self, rank: int, version: int, effects: list[Effect] = ()) -> None:  # type: ignore[assignment]
        self.record("ack", rank, {"incarnation": f"i{rank}", "version": version}, list(effects))

    def view(self, version: int, active: tuple[int, ...], **kw: Any) -> View:
        return View(
            group="g",
            version=version,
            active_ranks=active,
            rank_states={},
            healthy_set=active,
            cause={"kind": "formation", "proposals": [], "detail": ""},
            acked_ranks=kw.get("acked", active),
            dropped_ranks=kw.get("dropped", ()),
            offset=self.offset,
            ts=self.offset,
        )

    def commit(self, view: View, kind: str = "ack", rank: int | None = 0) -> None:
        self.record(kind, rank, {}, [ViewCommitted(view=view, offset=self.offset)])

    def formed(self) -> View:
        """Ranks 0 and 1 HEALTHY, version 1 prepared, ACKed by both and committed."""
        self.join_ready(0, 1)
        self.prepare(1, (0, 1))
        self.ack(0, 1)
        v = self.view(1, (0, 1))
        self.record(
            "ack",
            1,
            {"incarnation": "i1", "version": 1},
            [ViewCommitted(view=v, offset=self.offset)],
        )
        return v

    def status(self, failures: int = 0, change: dict[str, Any] | None = None) -> None:
        self.inv.check_status("g", {"change_in_flight": change, "failures": failures})


def _proposal(pid: int, status: str, op: str = "activate", ranks=(2,)) -> Proposal:
    return Proposal(
        id=pid,
        group="g",
        op=op,
        ranks=ranks,
        proposer="operator",
        idempotency_key=None,
        status=status,
        version=None,
        reason="",
        dropped_ranks=(),
        offset=pid,
        resolved_offset=None,
    )


def _raises(name: str) -> Any:
    return pytest.raises(Violation, match=f"^{name}: ")


def test_an_honest_history_passes_every_check() -> None:
    h = History(max_failure=2)
    v = h.formed()
    h.inv.check_agent_view_in_history("g", 0, "i0", v)
    h.status()
    pa = _proposal(h.offset, "pending", "deactivate", (1,))
    h.record("proposal", None, {}, [ProposalAccepted(proposal=pa, offset=h.offset)])
    h.prepare(2, (0,), "proposal", participants=(0, 1), proposals=[pa.id])
    h.ack(0, 2)
    h.record("exit", 1, {"incarnation": "i1"}, [h.state(1, "OFFLINE", "exited cleanly")])
    h.commit(h.view(2, (0,), acked=(0,)), "tick", None)
    done = msgspec.structs.replace(pa, status="applied", version=2)
    h.record("tick", None, {}, [ProposalResolved(proposal=done, offset=h.offset)])
    h.status(failures=0)
    h.inv.check_log_gap_free_and_kept(h.log, [(2, "join", "g", 0, {"incarnation": "i0"})])
    assert set(NAMES) | set(EPOCH_NAMES) == {
        "log_gap_free_and_kept",
        "one_view_per_version",
        "agent_view_in_history",
        "members_acked_or_dropped",
        "activation_healthy_clique",
        "terminal_proposals_final",
        "one_change_in_flight",
        "shutdown_once",
        "clean_exit_not_failure",
        "replay_identical",
        "converged",
        "epoch_exactly_once",
        "epoch_counted_unread",
        "part_follows_fold",
    }


def test_twin_log_gap_free_and_kept() -> None:
    h = History()
    h.join_ready(0)
    with _raises("log_gap_free_and_kept"):  # an offset skipped
        gap = Record(len(h.log) + 2, 0, 1, "tick", None, None, {}, 0)
        h.inv.check_log_gap_free_and_kept([*h.log, gap], [])
    with _raises("log_gap_free_and_kept"):  # an acknowledged record that is not what was sent
        h.inv.check_log_gap_free_and_kept(h.log, [(2, "join", "g", 0, {"incarnation": "other"})])
    with _raises("log_gap_free_and_kept"):  # the log lost its last record
        h.inv.check_log_gap_free_and_kept(h.log[:-1], [])


def test_twin_one_view_per_version() -> None:
    h = History()
    h.formed()
    with _raises("one_view_per_version"):  # version 1 again, with other ranks
        h.commit(h.view(1, (0,)))
    h2 = History()
    h2.join_ready(0, 1)
    h2.prepare(1, (0, 1))
    with _raises("one_view_per_version"):  # a version skipped
        h2.commit(h2.view(2, (0, 1)))


def test_twin_agent_view_in_history() -> None:
    h = History()
    v1 = h.formed()
    with _raises("agent_view_in_history"):  # a version never committed
        h.inv.check_agent_view_in_history("g", 0, "i0", msgspec.structs.replace(v1, version=2))
    with _raises("agent_view_in_history"):  # version 1 with other contents
        h.inv.check_agent_view_in_history(
            "g", 0, "i0", msgspec.structs.replace(v1, active_ranks=(0,))
        )
    h.inv.installed[(1, "i1")] = 2
    with _raises("agent_view_in_history"):  # going back
        h.inv.check_agent_view_in_history("g", 1, "i1", v1)


def test_twin_members_acked_or_dropped() -> None:
    h = History()
    h.join_ready(0, 1)
    h.prepare(1, (0, 1))
    h.ack(0, 1)
    with _raises("members_acked_or_dropped"):  # rank 1 never ACKed, yet it is named acked
        h.commit(h.view(1, (0, 1)))
    h = History()
    h.join_ready(0, 1)
    h.prepare(1, (0, 1))
    h.ack(0, 1)
    with _raises("members_acked_or_dropped"):  # rank 1 neither ACKed nor named dropped
        h.commit(h.view(1, (0,), acked=(0,)))
    h = History()
    h.join_ready(0, 1)
    with _raises("members_acked_or_dropped"):  # a commit without its prepare
        h.commit(h.view(1, (0, 1)))


def test_twin_activation_healthy_clique() -> None:
    h = History()
    h.join_ready(0, 1)
    h.record("links", 0, {"incarnation": "i0", "self_ready": True, "down": [1]}, [])
    with _raises("activation_healthy_clique"):  # 0 reports 1 down
        h.prepare(1, (0, 1))
    h = History()
    h.join_ready(0)
    h.record("join", 1, {"incarnation": "i1"}, [h.state(1, "SYNCED")])
    with _raises("activation_healthy_clique"):  # rank 1 is only SYNCED
        h.prepare(1, (0, 1))
    h = History()
    h.formed()
    pa = _proposal(h.offset, "pending", "activate", (2,))
    h.record("proposal", None, {}, [ProposalAccepted(proposal=pa, offset=h.offset)])
    with _raises("activation_healthy_clique"):  # rank 2 never joined
        h.prepare(2, (0, 1, 2), "proposal", proposals=[pa.id])
    for about, broken in ((1, False), (2, True)):
        # Rank 1 is replaced while view 1 holds: 0's report about view 1 describes the old
        # process (the replacement may be activated); one about view 2 describes the new one.
        h = History()
        h.formed()
        h.record("join", 1, {"incarnation": "i1b"}, [h.state(1, "SYNCED", inc="i1b")])
        h.record("links", 1, {"incarnation": "i1b", "self_ready": True}, [])
        h.record("tick", None, {}, [h.state(1, "HEALTHY", inc="i1b")])
        down = {"incarnation": "i0", "self_ready": True, "down": [1], "version": about}
        h.record("links", 0, down, [])
        pa = _proposal(h.offset, "pending", "activate", (1,))
        h.record("proposal", None, {}, [ProposalAccepted(proposal=pa, offset=h.offset)])
        if broken:
            with _raises("activation_healthy_clique"):
                h.prepare(2, (0, 1), "proposal", proposals=[pa.id])
        else:
            h.prepare(2, (0, 1), "proposal", proposals=[pa.id])


def test_twin_terminal_proposals_final() -> None:
    h = History()
    p = _proposal(h.offset, "pending")
    h.record("proposal", None, {}, [ProposalAccepted(proposal=p, offset=h.offset)])
    rejected = msgspec.structs.replace(p, status="rejected", reason="no")
    h.record("tick", None, {}, [ProposalResolved(proposal=rejected, offset=h.offset)])
    applied = msgspec.structs.replace(p, status="applied", version=1)
    with _raises("terminal_proposals_final"):
        h.record("tick", None, {}, [ProposalResolved(proposal=applied, offset=h.offset)])
    with _raises("terminal_proposals_final"):  # the fold's copy changed
        h.inv.check_terminal_still(lambda pid: applied)


def test_twin_one_change_in_flight() -> None:
    h = History()
    h.join_ready(0, 1)
    h.prepare(1, (0, 1))
    with _raises("one_change_in_flight"):  # version 2 prepared while 1 is in flight
        h.prepare(2, (0,), "auto_deactivation")
    h = History()
    h.formed()
    with _raises("one_change_in_flight"):
        h.status(change={"version": 3})


def test_twin_shutdown_once() -> None:
    h = History(max_failure=1)
    h.formed()
    h.record("tick", None, {}, [h.state(0, "OFFLINE", "heartbeat timeout")])
    with _raises("shutdown_once"):  # the budget is spent and nothing was said
        h.status(failures=1)
    down = ShutdownWithSave(group="g", reason="max_failure_exceeded", detail="", offset=h.offset)
    h.record("tick", None, {}, [down])
    again = msgspec.structs.replace(down, offset=h.offset)
    with _raises("shutdown_once"):
        h.record("tick", None, {}, [again])
    h = History(max_failure=2)
    h.formed()
    early = ShutdownWithSave(group="g", reason="max_failure_exceeded", detail="", offset=h.offset)
    with _raises("shutdown_once"):  # before the budget is spent
        h.record("tick", None, {}, [early])
    h.inv.check_agent_shutdown(0, "i0")
    with _raises("shutdown_once"):
        h.inv.check_agent_shutdown(0, "i0")


def test_twin_clean_exit_not_failure() -> None:
    h = History()
    h.formed()
    h.record("exit", 0, {"incarnation": "i0"}, [h.state(0, "OFFLINE", "exited cleanly")])
    h.status(failures=0)
    with _raises("clean_exit_not_failure"):  # the fold counted the exit
        h.status(failures=1)
    h = History()
    h.formed()
    h.record("exit", 0, {"incarnation": "i0"}, [])  # exited while the effect says otherwise
    h.record("tick", None, {}, [h.state(0, "OFFLINE", "heartbeat timeout")])
    with _raises("clean_exit_not_failure"):
        h.status(failures=1)


def test_twin_replay_identical() -> None:
    h = History()
    h.join_ready(0)
    healthy = h.state(0, "HEALTHY")
    rec = h.record("links", 0, {"incarnation": "i0", "self_ready": True}, [healthy])
    h.inv.on_record(rec, [healthy])  # the same again: fine
    with _raises("replay_identical"):
        h.inv.on_record(rec, [h.state(0, "SYNCED")])
    with _raises("replay_identical"):
        h.inv.check_projections({("view", "g", 1): {"version": 1}}, {})


def test_twin_converged() -> None:
    h = History()
    h.inv.check_converged(2, [(0, "i0", 2), (1, "i1", 2)])
    with _raises("converged"):  # rank 1 stranded on version 1
        h.inv.check_converged(2, [(0, "i0", 2), (1, "i1", 1)])
    with _raises("converged"):  # rank 0 holds no view at all
        h.inv.check_converged(2, [(0, "i0", None)])


def _epoch(sequences: dict[int, list[tuple[int, int]]], processed: dict[int, int]) -> Epoch:
    plan = EpochPlan(
        epoch=0,
        dataset_size=10,
        seed=0,
        shuffle=False,
        split="equal",
        partition_ratios=None,
        grain=1,
        lookahead=0,
        reclaim=False,
    )
    e = Epoch(plan, offset=5, version=1)
    for r, seq in sequences.items():
        h = e.holdings[r] = Holding()
        h.sequence = seq
        h.processed = processed.get(r, 0)
    e.unprocessed = sum(h.remaining for h in e.holdings.values())
    return e


def test_twin_epoch_exactly_once() -> None:
    h = History()
    v = h.formed()
    calm = {"change_in_flight": None}
    h.epochs.check_epoch(_epoch({0: [(0, 5)], 1: [(5, 5)]}, {0: 3}), v, calm)
    with _raises("epoch_exactly_once"):  # position 4 twice, position 9 nowhere
        h.epochs.check_epoch(_epoch({0: [(0, 5)], 1: [(4, 5)]}, {}), v, calm)
    broken = _epoch({0: [(0, 5)], 1: [(5, 5)]}, {0: 3})
    broken.unprocessed += 1
    with _raises("epoch_exactly_once"):  # the count and the ranges disagree
        h.epochs.check_epoch(broken, v, calm)
    with _raises("epoch_exactly_once"):  # rank 0's processed 0..2 handed to rank 1
        h.epochs.check_epoch(_epoch({0: [], 1: [(5, 5), (0, 5)]}, {}), v, calm)
    fresh = History()
    outside = msgspec.structs.replace(fresh.formed(), version=2, active_ranks=(0,))
    with _raises("epoch_exactly_once"):  # rank 1 is outside view 2 and still holds work
        fresh.epochs.check_epoch(_epoch({0: [(0, 5)], 1: [(5, 5)]}, {}), outside, calm)
    # while that view change is in flight, the ranges may still wait for its commit
    fresh.epochs.check_epoch(
        _epoch({0: [(0, 5)], 1: [(5, 5)]}, {}), outside, {"change_in_flight": {"version": 3}}
    )


def test_twin_epoch_counted_unread() -> None:
    h = History()
    v = h.formed()
    calm = {"change_in_flight": None}
    read = {0: {0, 1, 2}, 1: set()}
    h.epochs.check_epoch(_epoch({0: [(0, 5)], 1: [(5, 5)]}, {0: 3}), v, calm, read)
    with _raises("epoch_counted_unread"):  # rank 0 counted for 3 and 4, which it never read
        h.epochs.check_epoch(_epoch({0: [(0, 5)], 1: [(5, 5)]}, {0: 5}), v, calm, read)


def test_twin_part_follows_fold() -> None:
    inv = EpochChecks()
    e = _epoch({0: [(0, 5), (8, 2)], 1: [(5, 3)]}, {0: 3})
    e.assignment = 2
    inv.check_part(0, "i0", e, (2, 3, [(3, 2), (8, 2)]))  # exactly the fold's
    inv.check_part(0, "i0", e, (2, 1, [(1, 4), (8, 2)]))  # from an older cursor on
    inv.check_part(0, "i0", e, (1, 0, [(0, 5)]))  # behind: not yet told of decision 2
    inv.check_part(2, "i2", e, (2, 0, []))  # holds nothing, and nothing in the fold
    with _raises("part_follows_fold"):  # a move's slice appended twice
        inv.check_part(0, "i0", e, (2, 3, [(3, 2), (8, 2), (8, 2)]))
    with _raises("part_follows_fold"):  # a donor that kept its tail
        inv.check_part(1, "i1", e, (2, 0, [(5, 3), (8, 2)]))
    with _raises("part_follows_fold"):  # it holds a position that is rank 0's
        inv.check_part(2, "i2", e, (2, 0, [(9, 1)]))
