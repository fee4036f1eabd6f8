"""The epoch rule over random schedules: kills, replacements, deactivations, rejoins and
progress (good, stale, beyond the assignment, regressing) in any order, on the real fold.

After every record the fold must keep what docs/data.md promises:

- every position of the epoch is in exactly one rank's sequence (``covers_exactly``);
- the positions not reported processed are exactly the remaining ranges
  (``unprocessed == sum(remaining)``);
- what a rank reported processed stays with it: its processed prefix only grows, so no move
  ever hands out a position already processed;
- once no view change is in flight, a rank outside the committed view holds nothing;
- a refused report changes nothing (the epochs' snapshot is byte-identical before and after);
- every rank's reader, fed the agent updates the host publishes (each decision's
  ``data_moves`` once on the group's journal, applied by ``facets.epochs.cursor.apply_moves``), holds
  exactly the fold's part at every step, and so does one that resyncs at any point;
- and when every active rank reads its part to the end, the epoch completes with each
  position processed once.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.effects import Effect, Refused
from foldplane.coordinator.host.ready import HostState, ReadyBuilder
from foldplane.facets.epochs.cursor import apply_moves
from foldplane.facets.epochs.effects import EpochCompleted
from foldplane.facets.epochs.inputs import complete_plan
from foldplane.facets.epochs.partition import covers_exactly, split_at
from foldplane.facets.epochs.protocol import DataAssignmentUpdate, DataMovesUpdate, EpochPlanUpdate
from foldplane.wire.updates import Update
from tests.fold.script import Script

N = 5

op = st.one_of(
    st.tuples(st.just("progress"), st.integers(0, N - 1), st.floats(0.0, 1.0)),
    st.tuples(st.just("beyond"), st.integers(0, N - 1), st.integers(1, 50)),
    st.tuples(st.just("regress"), st.integers(0, N - 1), st.integers(1, 50)),
    st.tuples(st.just("stale"), st.integers(0, N - 1), st.integers(1, 50)),
    st.tuples(st.just("kill"), st.integers(0, N - 1), st.none()),
    st.tuples(st.just("deactivate"), st.integers(0, N - 1), st.none()),
    st.tuples(st.just("replace"), st.integers(0, N - 1), st.none()),
    st.tuples(st.just("resync"), st.integers(0, N - 1), st.none()),
)


class Reader:
    """One rank's part as the agent updates tell it (what the worker part's ``EpochTracker``
    keeps): whole from a ``data_assignment``, each later decision's moves applied in order."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.assignment = 0
        self.base = 0
        self.remaining: list[tuple[int, int]] = []

    def on_update(self, update: Update) -> None:
        if isinstance(update, EpochPlanUpdate):
            self.assignment = max(self.assignment, 1)
        elif isinstance(update, DataAssignmentUpdate):
            self.assignment = update.assignment
            self.base = update.processed
            self.remaining = list(update.remaining)
        elif isinstance(update, DataMovesUpdate) and update.assignment > self.assignment:
            assert update.assignment == self.assignment + 1, "a decision was skipped"
            self.assignment = update.assignment
            self.base, self.remaining = apply_moves(self.rank, self.base, self.remaining, update)


class Followed(Script):
    """A Script whose effects also go through the host's ``ReadyBuilder``: every agent update
    reaches the readers of the ranks whose journal it is published to."""

    def __init__(self) -> None:
        super().__init__()
        self.state = HostState()
        self.builder = ReadyBuilder(self.state, {})
        self.readers = {r: Reader(r) for r in range(N)}
        #: every update published, with the rank whose journal got it (None: the group's)
        self.published: list[tuple[int | None, dict[str, Any]]] = []

    def record(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> list[Effect]:
        effects = super().record(kind, group, rank, payload)
        ready = self.builder.ready(self.offset, effects, projected=self.offset)
        for _, to, update in ready.updates:
            self.published.append((to, update))
            for r in self.readers if to is None else [to]:
                self.readers[r].on_update(update)
        return effects

    def resync(self, rank: int) -> None:
        """A reader that missed updates: it takes the current state instead."""
        self.readers[rank] = Reader(rank)
        for update in self.state.resync(self.m, "g", [rank], None):
            self.readers[rank].on_update(update)

    def replay(self, rank: int) -> None:
        """A new process for ``rank``: it reads its journals from the start."""
        self.readers[rank] = Reader(rank)
        for to, update in self.published:
            if to is None or to == rank:
                self.readers[rank].on_update(update)


class Run:
    def __init__(self, size: int, split: str, grain: int, lookahead: int, reclaim: bool) -> None:
        self.s = Followed()
        self.s.form(world_size=N, heartbeat_timeout_s=3600.0)
        self.t = 1.0
        self.generation = {r: 0 for r in range(N)}
        body: dict[str, Any] = {
            "epoch": 0,
            "dataset_size": size,
            "split": split,
            "grain": grain,
            "lookahead": lookahead,
            "reclaim": reclaim,
        }
        if split == "ratios":
            body["partition_ratios"] = [1.0 + r for r in range(N)]
        self.s.at(self.t).record("epoch_plan", "g", None, complete_plan(body))
        self.size = size
        #: each rank's processed positions, as far as the fold has accepted them
        self.done: dict[int, set[int]] = {r: set() for r in range(N)}
        self.check()

    # -- the rule ----------------------------------------------------------------------------

    @property
    def epoch(self) -> Any:
        e = self.s.m.facet("epochs").epoch("g")
        assert e is not None
        return e

    def check(self) -> None:
        e = self.epoch
        assert covers_exactly([h.sequence for h in e.holdings.values()], self.size) is None
        assert e.unprocessed == sum(h.remaining for h in e.holdings.values())
        for r, h in e.holdings.items():
            head = split_at(h.sequence, h.processed)[0]
            now = {p for start, n in head for p in range(start, start + n)}
            assert self.done[r] <= now, f"rank {r} lost processed positions"
            self.done[r] = now
        for r, reader in self.s.readers.items():
            h = e.holdings.get(r)
            held = 0 if h is None else h.held
            processed = 0 if h is None else h.processed
            assert reader.assignment == e.assignment, f"rank {r}'s reader is behind"
            # what the reader holds from its cursor on is the fold's sequence from there on
            assert reader.base <= processed
            assert reader.base + sum(n for _, n in reader.remaining) == held
            tail = split_at(reader.remaining, processed - reader.base)[1]
            want = [] if h is None else h.remaining_segments()
            assert tail == want, f"rank {r}'s reader holds {tail}, the fold {want}"
        status = self.s.m.group_status("g")
        view = self.s.m.current_view("g")
        if status["change_in_flight"] is None and view is not None:
            for r, h in e.holdings.items():
                if not view.is_active(r):
                    assert h.remaining == 0, f"rank {r} is outside view {view.version}"

    def step(self) -> Script:
        self.t += 0.05
        return self.s.at(self.t)

    def settle(self) -> None:
        for _ in range(4):
            if self.s.m.group_status("g")["change_in_flight"] is None:
                return
            self.step().ack_all()
            self.check()

    # -- the schedule's operations -----------------------------------------------------------

    def refused_unchanged(self, payload: dict[str, Any], rank: int) -> None:
        before = msgspec.json.encode(self.s.m.facet("epochs").snapshot())
        out = self.step().record("progress", "g", rank, payload)
        assert any(isinstance(x, Refused) for x in out), out
        assert msgspec.json.encode(self.s.m.facet("epochs").snapshot()) == before

    def report(self, rank: int, processed: int) -> list[Any]:
        h = self.epoch.holdings[rank]
        payload = {
            "incarnation": self.s.inc(rank),
            "epoch": 0,
            "assignment": h.assignment,
            "processed": processed,
        }
        return self.step().record("progress", "g", rank, payload)

    def apply(self, kind: str, rank: int, arg: Any) -> None:
        s = self.s
        view = s.m.current_view("g")
        active = view is not None and view.is_active(rank)
        h = self.epoch.holdings.get(rank)
        base = {"incarnation": s.inc(rank), "epoch": 0}
        if kind == "progress" and active and h is not None:
            self.report(rank, h.processed + int(h.remaining * arg))
        elif kind == "beyond" and h is not None:
            payload = {**base, "assignment": h.assignment, "processed": h.held + arg}
            self.refused_unchanged(payload, rank)
        elif kind == "regress" and h is not None and h.processed:
            payload = {
                **base,
                "assignment": h.assignment,
                "processed": max(0, h.processed - arg),
            }
            self.refused_unchanged(payload, rank)
        elif kind == "stale" and h is not None and h.fence > 1:
            payload = {**base, "assignment": h.fence - 1, "processed": h.processed + 1}
            self.refused_unchanged(payload, rank)
        elif kind == "kill" and active and len(view.active_ranks) > 1:
            self.step().death(rank)
            self.t += 1.0  # past the reconciliation window
            self.step().tick()
            self.settle()
        elif kind == "deactivate" and active and len(view.active_ranks) > 1:
            self.step().propose("deactivate", [rank])
            self.settle()
        elif kind == "resync":
            s.resync(rank)
            h = self.epoch.holdings.get(rank)
            assert s.readers[rank].base == (0 if h is None else h.processed)
        elif kind == "replace" and not active:
            replaced = s.m.group_status("g")["ranks"][rank]["state"] == "OFFLINE"
            if replaced:
                # a dead rank comes back as a new incarnation; a deactivated one is still alive
                self.generation[rank] += 1
                self.step().join(rank, incarnation=f"g-{rank}-{self.generation[rank]}")
                self.step().links(rank)
            self.step().propose("activate", [rank])
            self.settle()
            h = self.epoch.holdings.get(rank)
            if replaced and h is not None and h.remaining:
                # its new process reads the whole history: once given work, it starts where
                # the fold's count of the rank is, not at positions its predecessor reported
                s.replay(rank)
                assert s.readers[rank].base == h.processed
        self.check()

    def drain(self) -> list[Any]:
        """Every active rank reads to the end; ranks that ran dry report again after a move."""
        out: list[Any] = []
        for _ in range(4 * N):
            e = self.epoch
            if e.completed is not None:
                break
            view = self.s.m.current_view("g")
            for r in sorted(e.holdings):
                h = e.holdings[r]
                if view.is_active(r) and h.remaining:
                    out += self.report(r, h.held)
                    self.check()
        return out


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    size=st.integers(1, 3000),
    split=st.sampled_from(["equal", "ratios", "throughput"]),
    grain=st.sampled_from([1, 1, 4, 32]),
    lookahead=st.sampled_from([0, 7, 100, 1024]),
    reclaim=st.booleans(),
    ops=st.lists(op, min_size=8, max_size=40),
)
def test_every_position_is_processed_exactly_once_over_any_schedule(
    size: int, split: str, grain: int, lookahead: int, reclaim: bool, ops: list[Any]
) -> None:
    run = Run(size, split, min(grain, size), lookahead, reclaim)
    for kind, rank, arg in ops:
        if run.epoch.completed is not None:
            break
        run.apply(kind, rank, arg)
    out = run.drain()
    e = run.epoch
    assert e.completed is not None, "the active ranks read everything and the epoch is open"
    assert e.unprocessed == 0
    done = [p for positions in run.done.values() for p in positions]
    assert sorted(done) == list(range(size))
    if out and any(isinstance(x, EpochCompleted) for x in out):
        completed = next(x for x in out if isinstance(x, EpochCompleted))
        assert sum(completed.processed.values()) == size


def test_a_replacement_that_reads_the_whole_history_starts_at_its_predecessors_count() -> None:
    run = Run(1200, "equal", 1, 10, False)
    run.apply("progress", 3, 0.4)
    run.apply("kill", 3, None)  # its remainder goes to 0..2; its sequence ends at its count
    run.apply("replace", 3, None)  # replays the history, takes a share: asserts the base
    h = run.epoch.holdings[3]
    assert h.processed > 0 and h.remaining > 0
    assert run.s.readers[3].base == h.processed
