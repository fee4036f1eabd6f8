"""The epochs facet's part of the simulator (its plugin's ``sim``, ``sim/world.py``): a seed's
epoch, the ranks that read it, and the invariants of its accounting.

**What a seed draws.** Most seeds read one epoch: the operator declares a plan (refused and
sent again until the group formed) at a moment drawn with it; half of those seeds also
*reassign* a rank: it is deactivated by proposal while it reads and activated again a little
later, its process reading throughout (the schedule of a late report about an old share). Each
is drawn from a stream of its own, so the other faults of a seed do not depend on them.

**What a rank does.** Each rank reads its part the way ``agent.data``'s sampler does, within its
lookahead, marking a batch processed a read after it yielded it, its count kept by the real
``facets.epochs.cursor.ReadCursor``, reporting progress through its real ``AgentMachine``;
kills, pauses, replacements and deactivations then move ranges as they would in a job.

**What is checked** after every step that changed the log (docs/data.md): every position of
the epoch is in exactly one rank's sequence, the unprocessed count is what is still assigned,
what the fold counted processed for a rank stays that rank's and was read by one of its
processes (``epoch_exactly_once``, ``epoch_counted_unread``), and an agent whose part is as of
the latest decision holds exactly the fold's (``part_follows_fold``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ...agent.machine import EventAnswered, SendEvent
from ...eventlog.record import NewRecord
from ...sim.invariants import Violation
from ...sim.world import GROUP, STALE, Fault, S
from ...wire.protocol import View
from .cursor import ReadCursor, apply_moves
from .inputs import complete_plan
from .partition import covers_exactly, split_at
from .protocol import (
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
    EpochPlanUpdate,
    ProgressEvent,
)

#: The invariants this part checks, by name, in the order they are stated below.
NAMES = ("epoch_exactly_once", "epoch_counted_unread", "part_follows_fold")
#: The updates a simulated worker's reader follows.
_DATA_UPDATES = (EpochPlanUpdate, DataAssignmentUpdate, DataMovesUpdate, EpochCompleteUpdate)


def draw(seed: int, ranks: int, horizon: float) -> tuple[Any, list[Fault]]:
    """The seed's epoch (its plan and the moment the operator declares it, or None) and the
    faults it brings (a reassignment, for some of the seeds that read one)."""
    epoch = _epoch_plan(seed, ranks, horizon)
    return epoch, _reassignments(seed, ranks, epoch)


def _reassignments(seed: int, n: int, epoch: tuple[int, dict[str, Any]] | None) -> list[Fault]:
    """Some seeds that read an epoch deactivate a running rank by proposal while it reads and
    activate it again a little later (its process reading throughout: what it read and had
    not reported when its share was taken is marked after, and its reports may arrive after
    the reactivation). Drawn from a stream of their own, so the other faults of a seed do not
    depend on them."""
    rng = random.Random(f"reassign-{seed}")
    if epoch is None or rng.random() < 0.5:
        return []
    t = epoch[0] + round(rng.uniform(0.5, 4.0) * S)
    return [Fault(t, "reassign", (rng.randrange(n), round(rng.uniform(0.3, 3.0) * S)))]


def _epoch_plan(seed: int, n: int, horizon: float) -> tuple[int, dict[str, Any]] | None:
    """Most seeds read one epoch: its plan and the moment the operator declares it (drawn
    from a stream of its own, so the fault schedule of a seed does not depend on it)."""
    rng = random.Random(f"epoch-{seed}")
    if rng.random() < 0.15:
        return None
    size = rng.choice((rng.randint(1, 40), rng.randint(100, 3000)))
    split = rng.choice(("equal", "ratios", "throughput"))
    body: dict[str, Any] = {
        "epoch": 0,
        "dataset_size": size,
        "seed": rng.randrange(2**32),
        "shuffle": rng.random() < 0.5,
        "split": split,
        "grain": min(size, rng.choice((1, 1, 4, 16))),
        "lookahead": rng.choice((0, 8, 64, 1024)),
        "reclaim": rng.random() < 0.6,
    }
    if split == "ratios":
        body["partition_ratios"] = [rng.choice((0.5, 1.0, 2.0)) for _ in range(n)]
    return round(rng.uniform(0.0, horizon / 2) * S), complete_plan(body)


class Sim:
    """The facet in one simulated world: the operator's plan, each process's reader, and the
    invariants of the epoch checked against the fold."""

    def __init__(self, world: Any, drawn: tuple[int, dict[str, Any]] | None) -> None:
        self.world = world
        #: the epoch plan the operator declares, and when (ns); None for a run without one
        self.epoch = drawn
        #: rank -> the positions of the epoch any of its processes read
        self.read: dict[int, set[int]] = {}
        self.checks = EpochChecks()

    def start(self) -> None:
        """Schedule the operator's plan."""
        if self.epoch is not None:
            self.world.at(self.epoch[0], self.plan_epoch)

    def plan_epoch(self) -> None:
        """The operator declares the epoch (``POST /groups/g/epochs``), again each second until
        the log holds it: before the group formed it is refused."""
        assert self.epoch is not None
        world = self.world
        if any(rec.kind == "epoch_plan" for rec in world.log):
            return
        rec = NewRecord(kind="epoch_plan", group=GROUP, payload=dict(self.epoch[1]))
        world.operator_record(rec)
        world.at(world.now + S, self.plan_epoch)

    def worker(self, process: Any) -> Worker:
        """The facet's part of a new process of ``process.rank``: its reader."""
        return Worker(process, self.world.rng.uniform(50.0, 400.0), self.read)

    def check(self, coord: Any, status: dict[str, Any]) -> None:
        """The epoch's invariants against the fold of ``coord`` (a step changed the log)."""
        world = self.world
        epoch = coord.machine.facet("epochs").epoch(GROUP)
        if epoch is None:
            return
        self.checks.check_epoch(epoch, coord.machine.current_view(GROUP), status, self.read)
        for p in world.procs.values():
            r = p.facets["epochs"].reader
            # an agent ahead of this log (a restore) holds what it has not heard
            if p.running and r.epoch == epoch.number and p.machine.after <= coord.core.applied:
                part = (r.assignment, r.base, r.remaining)
                self.checks.check_part(p.rank, p.incarnation, epoch, part)


class Worker:
    """A process's reader and its training loop's timer: it reads a batch a little after the
    step before, and reports how far it is through the process's agent machine."""

    def __init__(self, process: Any, rate: float, read: dict[int, set[int]]) -> None:
        self.process = process
        self.reader = _Reader(process.rank, rate, read.setdefault(process.rank, set()))
        self.read_gen = 0

    def on_update(self, update: Any) -> None:
        """A facet update the process's agent handed on (``FacetUpdate``)."""
        if isinstance(update, _DATA_UPDATES) and self.reader.on_update(update):
            self.read_later()

    def on_answer(self, action: Any) -> None:
        """The answer to an event the process sent (every facet's part is handed each: this
        one takes the answers to its progress reports, ``EventAnswered`` of ``progress``)."""
        if isinstance(action, EventAnswered) and action.kind == "progress":
            self.reader.on_answer(action)

    def read_later(self) -> None:
        """The training loop reads its next batch a little later."""
        w = self.process.world
        self.read_gen += 1
        at = w.now + round(w.rng.uniform(0.2, 1.0) * w.setup.heartbeat_s * S)
        w.at(at, self.read, self.read_gen)

    def read(self, gen: int) -> Any:
        """Read a batch of this rank's part and report how far it is. The reader's own timer:
        it is not a step (the report it sends is one, at the coordinator)."""
        process = self.process
        if gen != self.read_gen or not process.alive:
            return STALE
        if not process.running:
            process.world.at(process.paused_until, self.read, gen)
            return STALE
        report = self.reader.read(process.world.rng)
        if report is not None:
            epoch, assignment, processed, rate = report
            fields = {"epoch": epoch, "assignment": assignment, "processed": processed}
            process.feed(
                SendEvent(process.now(), "progress", {**fields, "rate": rate}, ProgressEvent)
            )
        if not self.reader.finished:
            self.read_later()
        return STALE


class _Reader:
    """What a rank's sampler does with its part of the epoch (``agent.data``, reduced to its
    accounting): it yields positions of its sequence front to back, never more than
    ``lookahead`` beyond what the coordinator accepted, marks them processed a read later (the
    training step between) and reports its count against the assignment it holds. Its part
    follows the updates as ``agent.data`` does: whole in a ``data_assignment``, the moves of
    each later decision applied to it (``facets.epochs.cursor.apply_moves``), and its count follows the
    part through the real ``facets.epochs.cursor.ReadCursor`` (what it yielded from a share it no longer
    holds counts nothing when marked). Every position it yields is added to ``read``, the
    positions its rank read (every incarnation's): the fold may count a rank only for those."""

    def __init__(self, rank: int, rate: float, read: set[int]) -> None:
        self.rank = rank
        self.rate = rate
        self.read_positions = read
        self.epoch: int | None = None
        self.lookahead = 0
        self.grain = 1
        self.assignment = 0
        #: the part: the coordinator's count it starts from and what it holds from there on
        self.base = 0
        self.remaining: list[tuple[int, int]] = []
        self.cursor = ReadCursor()
        self.accepted = 0
        self.finished = False

    def on_update(
        self, update: EpochPlanUpdate | DataAssignmentUpdate | DataMovesUpdate | EpochCompleteUpdate
    ) -> bool:
        """Take an update; True when there is now something to read."""
        if isinstance(update, EpochPlanUpdate):
            if self.epoch != update.epoch:
                self.assignment, self.base, self.remaining = 1, 0, []
                self.cursor = ReadCursor()
                self.accepted = 0
            self.epoch = update.epoch
            self.lookahead = update.lookahead
            self.grain = update.grain
        elif isinstance(update, DataAssignmentUpdate):  # the whole part: the plan's, a resync's
            self.epoch = update.epoch
            self.assignment = update.assignment
            self._part(update.processed, list(update.remaining))
        elif isinstance(update, DataMovesUpdate) and update.assignment == self.assignment + 1:
            # (an older decision is already in the part; a gap cannot come from the journals)
            self.assignment += 1
            self._part(*apply_moves(self.rank, self.base, self.remaining, update))
        elif isinstance(update, EpochCompleteUpdate):
            self.finished = True
        return not self.finished and self.cursor.yielded < self.held

    def _part(self, base: int, remaining: list[tuple[int, int]]) -> None:
        self.cursor.follow(self.base, self.remaining, base, remaining)
        self.base, self.remaining = base, remaining
        self.accepted = max(self.accepted, self.base)

    @property
    def held(self) -> int:
        return self.base + sum(n for _, n in self.remaining)

    def position(self, index: int) -> int:
        at = index - self.base
        for start, n in self.remaining:
            if at < n:
                return start + at
            at -= n
        raise IndexError(index)

    def on_answer(self, answer: EventAnswered) -> None:
        fields = answer.fields
        if answer.error is None and fields["assignment"] == self.assignment:
            self.accepted = max(self.accepted, fields["processed"])

    def read(self, rng: random.Random) -> tuple[int, int, int, float] | None:
        """One training step: the batch yielded at the step before is marked processed, the
        next one is yielded; the report is the count against the part held now."""
        if self.epoch is None or self.finished or not self.assignment:
            return None
        cursor = self.cursor
        cursor.mark(cursor.unmarked)
        limit = min(self.held, self.accepted + self.lookahead)
        if cursor.yielded < limit:
            for _ in range(rng.randint(1, min(limit - cursor.yielded, 3 * self.grain))):
                self.read_positions.add(self.position(cursor.take()))
        elif cursor.processed <= self.accepted:
            return None  # everything read was accepted: wait for more, or the epoch's end
        return self.epoch, self.assignment, cursor.processed, self.rate


class EpochChecks:
    """The epoch's invariants, with what they remember of earlier steps."""

    def __init__(self) -> None:
        #: (epoch, rank) -> the positions the fold has counted processed for that rank
        self.processed: dict[tuple[int, int], frozenset[int]] = {}

    def check_epoch(
        self,
        epoch: Any,
        view: View | None,
        status: dict[str, Any],
        read: dict[int, set[int]] | None = None,
    ) -> None:
        """The epoch's accounting (docs/data.md): every position of the epoch is in exactly one
        rank's sequence; the positions not reported processed are exactly the ranges still
        assigned; what the fold counted processed for a rank stays processed and stays that
        rank's (across moves, coordinator restarts and replacements: it is never handed out
        again); a rank is counted only for positions one of its processes read (``read``: a
        report made before a reassignment is never credited to the share given after it); and
        with no view change in flight, a rank outside the committed view holds nothing. This
        check reads the fold's epoch (its holdings are the thing checked); the processed
        positions it remembers are its own, from every earlier step."""
        sequences = {r: h.sequence for r, h in epoch.holdings.items()}
        problem = covers_exactly(sequences.values(), epoch.plan.dataset_size)
        if problem is not None:
            raise Violation("epoch_exactly_once", f"epoch {epoch.number}: {problem}")
        remaining = sum(h.remaining for h in epoch.holdings.values())
        if epoch.unprocessed != remaining:
            raise Violation(
                "epoch_exactly_once",
                f"epoch {epoch.number}: {epoch.unprocessed} unprocessed, {remaining} assigned",
            )
        for r, h in sorted(epoch.holdings.items()):
            head = split_at(h.sequence, h.processed)[0]
            now = frozenset(p for start, n in head for p in range(start, start + n))
            before = self.processed.get((epoch.number, r), frozenset())
            if not before <= now:
                lost = sorted(before - now)[:5]
                raise Violation(
                    "epoch_exactly_once",
                    f"epoch {epoch.number}: rank {r}'s processed positions {lost} left it",
                )
            if read is not None and now != before:
                unread = sorted(now - before - read.get(r, set()))
                if unread:
                    raise Violation(
                        "epoch_counted_unread",
                        f"epoch {epoch.number}: rank {r} is counted for positions {unread[:5]} "
                        "none of its processes read",
                    )
            self.processed[(epoch.number, r)] = now
        if status["change_in_flight"] is None and view is not None:
            outside = [
                r
                for r, h in sorted(epoch.holdings.items())
                if h.remaining and not view.is_active(r)
            ]
            if outside:
                raise Violation(
                    "epoch_exactly_once",
                    f"epoch {epoch.number}: ranks {outside} hold work outside view {view.version}",
                )

    def check_part(
        self,
        rank: int,
        incarnation: str,
        epoch: Any,
        part: tuple[int, int, Sequence[tuple[int, int]]],
    ) -> None:
        """What an agent holds of the epoch follows the fold (docs/data.md): an agent whose
        part is as of the epoch's latest decision (``part``: its assignment, its base and what
        it holds from there, as the agent updates told it: the plan's parts, each later
        decision's moves, a resync's whole part) holds exactly the fold's part of its rank:
        its base is at most the fold's cursor, and from the fold's cursor on it holds the
        fold's remaining segments, nothing more."""
        assignment, base, remaining = part
        if assignment != epoch.assignment:
            return
        h = epoch.holdings.get(rank)
        processed = 0 if h is None else h.processed
        want = [] if h is None else split_at(h.sequence, h.processed)[1]
        held = sum(n for _, n in remaining)
        tail = split_at(list(remaining), processed - base)[1] if base <= processed else None
        if tail != want or base + held != processed + sum(n for _, n in want):
            raise Violation(
                "part_follows_fold",
                f"epoch {epoch.number} assignment {assignment}: rank {rank} ({incarnation}) "
                f"holds {list(remaining)[:4]} from {base}; the fold: {want[:4]} from {processed}",
            )
