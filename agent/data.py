"""Data that survives a dead rank: the epoch's part of this rank, and the torch ``Sampler`` that
reads it (docs/data.md).

>>> sampler = ElasticSampler(len(dataset))          # the foldplane default group's agent
>>> loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2)
>>> for epoch in range(epochs):
...     sampler.set_epoch(epoch)                      # every rank: the same plan, declared once
...     while sampler.next_pass():                    # False once the whole epoch is processed
...         for batch in loader:                      # one pass over what this rank holds
...             train_step(batch)
...             sampler.mark_processed(len(batch))    # these samples are done: reported

The coordinator gives each active rank a *sequence* of ranges of the epoch's permutation
(``facets/epochs/fold.py``); this module follows it:

- :class:`EpochTracker` (one per agent, ``agent.data``) holds what the coordinator said about
  this rank's part (the plan, the latest assignment, the epoch's end) and reports progress
  through the agent: one report in flight, the newest replacing one not yet sent.
- :class:`ElasticSampler` yields the dataset indices of this rank's positions, in order. It
  never runs more than the plan's ``lookahead`` positions ahead of the progress the
  coordinator has accepted (the coordinator moves only positions beyond that window, so what
  it hands out is never taken away), and reports early enough that the window keeps moving.
  A pass over the loader reads what the rank holds, including what it is given meanwhile (a
  dead rank's remainder, a reclaim); the pass ends when the part is used up, so the loader can
  hand out its last, partial batch. :meth:`ElasticSampler.next_pass` then reports everything
  processed and waits: for more work (another pass) or for the epoch's end.

A position is *processed* when the training loop says so (``mark_processed``), in the order
the sampler yielded them; what a rank yielded and did not report when it died is read again by
the ranks that take its remainder over. The count follows the part (``facets.epochs.cursor.ReadCursor``,
kept by the tracker and moved with every change of the part under the same lock): a position
yielded from a share this rank no longer holds (a deactivation took it, a resync replaced it)
counts nothing when it is marked, so every report counts positions of the part it is sent
against and a late mark is never credited to a share given after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler

from ..facets.epochs.cursor import PartMismatch, ReadCursor, apply_moves
from ..facets.epochs.protocol import (
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
    EpochPlanUpdate,
)
from ..wire.codes import NOT_JOINED, RANK_OFFLINE, STALE_ASSIGNMENT

log = logging.getLogger("foldplane.data")

#: A report without an answer after this long is sent again (the agent may have rejoined and
#: dropped it).
RESEND_S = 5.0
#: Progress is reported at least this often while a rank reads (its rate is the throughput
#: split's weight).
REPORT_EVERY_S = 1.0


class EpochError(RuntimeError):
    """The coordinator refused the epoch's plan or this rank's progress; the message says why."""


@dataclass
class Part:
    """This rank's part of one epoch, as the coordinator last said it."""

    epoch: int
    #: the epoch's decision it is as of (progress is reported against it): the plan's (1), a
    #: later one applied from ``data_moves``, or the latest one in a resync
    assignment: int = 0
    #: positions of the rank's sequence the coordinator has accepted as processed
    base: int = 0
    #: what the rank holds from ``base`` on: ``(start, length)`` segments, in reading order
    remaining: list[tuple[int, int]] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The index in the rank's sequence after its last position."""
        return self.base + sum(n for _, n in self.remaining)

    def position(self, index: int) -> int:
        """The permutation position at ``index`` of the rank's sequence (``base <= index <
        end``)."""
        at = index - self.base
        for start, n in self.remaining:
            if at < n:
                return start + at
            at -= n
        raise IndexError(f"index {index} is beyond the part (ends at {self.end})")


class EpochTracker:
    """What the coordinator said about this rank's epochs, shared by the agent's driver
    thread (which feeds it updates and answers) and the sampler (which reads and waits)."""

    def __init__(self, rank: int, report: Callable[[int, int, int, float | None], None]) -> None:
        self.rank = rank
        self._report = report
        self._cond = threading.Condition()
        self.plans: dict[int, EpochPlanUpdate] = {}
        self.parts: dict[int, Part] = {}
        self.complete: set[int] = set()
        #: where the sampler stands in this rank's part, per epoch it reads (what it reports)
        self.cursors: dict[int, ReadCursor] = {}
        #: the highest progress the coordinator accepted, per epoch
        self.accepted: dict[int, int] = {}
        self.error: str | None = None
        self._in_flight: tuple[int, int, int] | None = None
        self._sent_at = 0.0
        #: the newest progress to report: epoch, rate, and whether it is urgent (the count is
        #: the cursor's when it is sent, against the part it counts)
        self._wanted: tuple[int, float | None, bool] | None = None
        self._last_report = 0.0
        #: an assignment the coordinator called stale: nothing is sent against it again
        self._stale: tuple[int, int] | None = None
        self.stopped: str | None = None

    # -- from the agent's driver ------------------------------------------------------------

    def on_update(
        self, update: EpochPlanUpdate | DataAssignmentUpdate | DataMovesUpdate | EpochCompleteUpdate
    ) -> None:
        with self._cond:
            if isinstance(update, EpochPlanUpdate):
                self.plans[update.epoch] = update
                # the first split (assignment 1) gives a rank that holds a part its own
                # data_assignment, at the plan's offset; one that gets none holds nothing
                self.parts.setdefault(update.epoch, Part(update.epoch, 1))
            elif isinstance(update, DataMovesUpdate):
                self._on_moves(update)
            elif isinstance(update, DataAssignmentUpdate):
                # the whole part (the plan's, a resync's or a new incarnation's: the current
                # state, even when it is behind what this agent heard from a log restored from
                # an older copy)
                epoch, base = update.epoch, update.processed
                self._set_part(Part(epoch, update.assignment, base, list(update.remaining)))
                if base > self.accepted.get(epoch, 0):
                    self.accepted[epoch] = base
            elif isinstance(update, EpochCompleteUpdate):
                self.complete.add(update.epoch)
            self._cond.notify_all()
        self._maybe_send()

    def _on_moves(self, update: DataMovesUpdate) -> None:
        """A later decision of the epoch, applied to this rank's part (``facets.epochs.cursor``). Its
        number is the part's next one; an older one is already in the part (a resync sent the
        part as of a later decision). A gap, or moves that do not fit, leave the part as it
        was and say so: the coordinator then refuses this rank's reports against it, and the
        error names why."""
        epoch, assignment = update.epoch, update.assignment
        part = self.parts.get(epoch)
        if part is None or assignment <= part.assignment:
            return
        if assignment != part.assignment + 1:
            self.error = (
                f"epoch {epoch}: decision {assignment} arrived while this rank's part is as of "
                f"decision {part.assignment}; decisions {part.assignment + 1}..{assignment - 1} "
                "never arrived"
            )
            log.warning("rank %d: %s", self.rank, self.error)
            return
        try:
            base, remaining = apply_moves(self.rank, part.base, part.remaining, update)
        except PartMismatch as exc:
            self.error = f"epoch {epoch}: {exc}"
            log.warning("rank %d: %s", self.rank, self.error)
            return
        self._set_part(Part(epoch, assignment, base, remaining))
        if base > self.accepted.get(epoch, 0):
            self.accepted[epoch] = base

    def _set_part(self, part: Part) -> None:
        """``part`` replaces this rank's part of its epoch; the sampler's cursor follows it
        (what it yielded beyond the first changed position is void)."""
        old = self.parts.get(part.epoch)
        self.parts[part.epoch] = part
        cursor = self.cursors.get(part.epoch)
        if cursor is not None:
            if old is None:
                cursor.advance(part.base)
            else:
                cursor.follow(old.base, old.remaining, part.base, part.remaining)

    def start_reading(self, epoch: int) -> ReadCursor:
        """The sampler's cursor in this rank's part of ``epoch`` (made at the part's base the
        first time)."""
        with self._cond:
            cursor = self.cursors.get(epoch)
            if cursor is None:
                part = self.parts.get(epoch)
                cursor = self.cursors[epoch] = ReadCursor(0 if part is None else part.base)
            return cursor

    def on_answer(
        self, epoch: int, assignment: int, processed: int, error: str | None, detail: str
    ) -> None:
        with self._cond:
            self._in_flight = None
            if error is None:
                if processed > self.accepted.get(epoch, 0):
                    self.accepted[epoch] = processed
            elif error == STALE_ASSIGNMENT:
                self._stale = (epoch, assignment)  # sent again against the part it receives
            elif error in (NOT_JOINED, RANK_OFFLINE):
                pass  # sent again after the join (a wait resends what is overdue)
            else:
                self.error = f"progress for epoch {epoch} refused: {error}: {detail}"
                log.warning("rank %d: %s", self.rank, self.error)
            self._cond.notify_all()
        if error is None:
            self._maybe_send()

    def on_stopped(self, why: str) -> None:
        with self._cond:
            self.stopped = why
            self._cond.notify_all()

    # -- from the sampler -------------------------------------------------------------------

    def want_report(self, epoch: int, rate: float | None, urgent: bool) -> None:
        """Report the cursor of ``epoch``: sent when nothing is in flight, at once when
        ``urgent`` (the read-ahead window is closing, or the part is used up), else at most
        every :data:`REPORT_EVERY_S`. What is sent is the cursor's count then, against the
        assignment of the part it counts."""
        with self._cond:
            self._wanted = (epoch, rate, urgent)
        self._maybe_send()

    def wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (under the tracker's lock) until ``predicate()``; resends a report whose
        answer is overdue while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if predicate():
                    return True
                if self.stopped is not None:
                    raise EpochError(f"rank {self.rank}: the agent stopped: {self.stopped}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(min(RESEND_S / 5, left) if left is not None else RESEND_S / 5)
            self._maybe_send()

    @property
    def lock(self) -> threading.Condition:
        return self._cond

    def _maybe_send(self) -> None:
        with self._cond:
            wanted = self._wanted
            if wanted is None:
                return
            now = time.monotonic()
            if self._in_flight is not None and now - self._sent_at < RESEND_S:
                return
            epoch, rate, urgent = wanted
            part = self.parts.get(epoch)
            cursor = self.cursors.get(epoch)
            if part is None or part.assignment == 0 or self._stale == (epoch, part.assignment):
                return
            if cursor is None:
                return
            processed = cursor.processed
            if processed <= self.accepted.get(epoch, 0) and self._in_flight is None:
                return
            if not urgent and now - self._last_report < REPORT_EVERY_S:
                return
            self._in_flight = (epoch, part.assignment, processed)
            self._sent_at = self._last_report = now
            assignment = part.assignment
        self._report(epoch, assignment, processed, rate)


class ElasticSampler(Sampler[int]):
    """A torch ``Sampler`` over this rank's part of each epoch (see the module docstring).

    ``dataset_size`` is the dataset's length (or pass the dataset). The plan's fields
    (``seed``, ``shuffle``, ``split``: ``"equal"``, ``"ratios"`` with ``partition_ratios``,
    or ``"throughput"``; ``grain``, ``lookahead``, ``reclaim``) are declared by
    :meth:`set_epoch`, identically on every rank; see docs/data.md. ``agent`` defaults to the
    agent of the foldplane default group (``dist.init_process_group("foldplane")``).
    ``wait_s`` bounds every wait for the coordinator (None: wait as long as it takes).
    """

    def __init__(
        self,
        dataset_size: int | Sequence[Any],
        agent: Any = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        split: str = "equal",
        partition_ratios: Sequence[float] | None = None,
        grain: int = 1,
        lookahead: int = 1024,
        reclaim: bool | None = None,
        wait_s: float | None = 600.0,
    ) -> None:
        size = dataset_size if isinstance(dataset_size, int) else len(dataset_size)
        if size < 1:
            raise ValueError(f"an epoch needs at least one sample, got a dataset of {size}")
        if agent is None:
            import torch.distributed as dist

            agent = getattr(dist.group.WORLD, "agent", None)
            if agent is None:
                raise RuntimeError(
                    "ElasticSampler needs the foldplane agent: pass agent=..., or call "
                    'dist.init_process_group("foldplane") first'
                )
        self.agent = agent
        self.dataset_size = size
        self.plan: dict[str, Any] = {
            "dataset_size": size,
            "seed": seed,
            "shuffle": shuffle,
            "split": split,
            "grain": grain,
            "lookahead": lookahead,
        }
        if partition_ratios is not None:
            self.plan["partition_ratios"] = [float(r) for r in partition_ratios]
        if reclaim is not None:
            self.plan["reclaim"] = reclaim
        self.wait_s = wait_s
        self.tracker: EpochTracker = agent.data
        self.epoch: int | None = None
        self._perm: torch.Tensor | None = None
        #: where this sampler stands in the rank's part of its epoch (kept by the tracker,
        #: which moves it with the part; read and changed under the tracker's lock)
        self._cursor = ReadCursor()
        #: for the rate: processed at the epoch's start, and the time spent reading (waits for
        #: the coordinator do not count)
        self._counted_since = 0
        self._reading_s = 0.0
        self._read_from = time.monotonic()
        #: the thread that marked samples processed last
        self._marker: int | None = threading.get_ident()

    # -- the epoch --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Declare epoch ``epoch`` (every rank calls it with the same plan: the first call
        appends it, the others get the same answer) and wait until this rank knows its part.
        An epoch begins once the one before it is complete."""
        if epoch == self.epoch:
            return
        if self.epoch is not None:
            self._wait(
                lambda: self.epoch in self.tracker.complete,
                f"epoch {self.epoch} to complete before epoch {epoch}",
            )
        self.agent.plan_epoch(epoch=epoch, **self.plan)
        self._wait(lambda: epoch in self.tracker.plans, f"the plan of epoch {epoch}")
        self.epoch = epoch
        plan = self.tracker.plans[epoch]
        if plan.lookahead < 1:
            raise EpochError(
                f"epoch {epoch}'s lookahead is {plan.lookahead}: a sampler needs at least one "
                "position (a batch and the loader's prefetch is a good size)"
            )
        if plan.shuffle:
            gen = torch.Generator().manual_seed(plan.seed + epoch)
            self._perm = torch.randperm(self.dataset_size, generator=gen)
        else:
            self._perm = None
        self._cursor = self.tracker.start_reading(epoch)
        self._counted_since, self._reading_s = self._cursor.processed, 0.0
        self._read_from = time.monotonic()

    @property
    def lookahead(self) -> int:
        assert self.epoch is not None
        return self.tracker.plans[self.epoch].lookahead

    def __len__(self) -> int:
        """What this rank holds of the epoch and has not yet read (it may grow or shrink as
        ranks come and go)."""
        if self.epoch is None:
            return 0
        with self.tracker.lock:
            part = self.tracker.parts.get(self.epoch)
            return 0 if part is None else max(0, part.end - self._cursor.yielded)

    def __iter__(self) -> Iterator[int]:
        if self.epoch is None:
            raise RuntimeError("call sampler.set_epoch(epoch) before iterating")
        epoch = self.epoch
        tracker = self.tracker
        cursor = self._cursor
        while True:
            with tracker.lock:
                part = tracker.parts[epoch]
                window = tracker.accepted.get(epoch, 0) + self.lookahead
                ahead = cursor.yielded < min(part.end, window)
                position = part.position(cursor.take()) if ahead else None
                used_up = cursor.yielded >= part.end
            if position is not None:
                yield self._index(position)
                continue
            if used_up:
                return  # the pass is over: next_pass() waits for more or for the epoch's end
            # the read-ahead window is closed: report what is processed, wait for it to move
            self._check_not_stuck(epoch)
            self._report(urgent=True)
            self._wait(
                lambda: self._window_open(epoch),
                f"the coordinator to accept epoch {epoch}'s progress (read {cursor.yielded}, "
                f"processed {cursor.processed}, lookahead {self.lookahead})",
            )

    def _check_not_stuck(self, epoch: int) -> None:
        """A closed window opens only when the coordinator accepts more progress. If all that
        was marked processed is accepted already and the thread marking it is this one (a
        ``DataLoader`` asks for indices in the thread that trains), nothing can open it:
        say why instead of waiting forever."""
        accepted = self.tracker.accepted.get(epoch, 0)
        if self._cursor.processed <= accepted and self._marker == threading.get_ident():
            raise EpochError(
                f"rank {self.tracker.rank}: the sampler read {self._cursor.unmarked} "
                f"positions ahead of what is processed, its whole lookahead "
                f"({self.lookahead}), and the thread that marks them processed is waiting for "
                "more: the loader reads further ahead than the lookahead. Plan a lookahead of "
                "at least batch_size x (num_workers x prefetch_factor + 2)"
            )

    def next_pass(self) -> bool:
        """Whether there is a pass to read: True at once while this rank holds positions it
        has not read; otherwise everything processed is reported and it waits until the rank
        is given more (True) or every rank's part is processed and the epoch is complete
        (False). Every position yielded must be marked processed first."""
        if self.epoch is None:
            raise RuntimeError("call sampler.set_epoch(epoch) first")
        epoch = self.epoch
        if self._cursor.unmarked:
            raise RuntimeError(
                f"{self._cursor.unmarked} samples of this pass are not marked "
                "processed: mark_processed() every batch before the next pass (the epoch ends "
                "only when every rank's part is reported)"
            )
        self._report(urgent=True)

        def ready() -> bool:
            part = self.tracker.parts[epoch]
            return self._cursor.yielded < part.end or epoch in self.tracker.complete

        self._wait(ready, f"more of epoch {epoch} or its end (processed {self._cursor.processed})")
        with self.tracker.lock:
            return self._cursor.yielded < self.tracker.parts[epoch].end

    @property
    def epoch_complete(self) -> bool:
        """Every position of the epoch was reported processed (by some rank)."""
        return self.epoch is not None and self.epoch in self.tracker.complete

    def _window_open(self, epoch: int) -> bool:
        part = self.tracker.parts[epoch]
        window = self.tracker.accepted.get(epoch, 0) + self.lookahead
        yielded = self._cursor.yielded
        return yielded < min(part.end, window) or yielded >= part.end

    def _index(self, position: int) -> int:
        return int(self._perm[position]) if self._perm is not None else position

    # -- progress ---------------------------------------------------------------------------

    def mark_processed(self, count: int) -> None:
        """The next ``count`` samples this sampler yielded are processed (reported to the
        coordinator, early enough that the read-ahead window never closes)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        assert self.epoch is not None
        with self.tracker.lock:
            cursor = self._cursor
            if count > cursor.unmarked:
                raise ValueError(
                    f"marking {count} more processed would pass what this sampler yielded "
                    f"({cursor.unmarked} not marked yet)"
                )
            cursor.mark(count)
            behind = cursor.processed - self.tracker.accepted.get(self.epoch, 0)
            used_up = cursor.processed >= self.tracker.parts[self.epoch].end
        self._marker = threading.get_ident()
        self._report(urgent=behind >= max(1, self.lookahead // 2) or used_up)

    @property
    def processed(self) -> int:
        """Positions of this rank's part counted processed: what it reports (a position
        yielded from a share the rank no longer holds counts nothing when marked)."""
        return self._cursor.processed

    def _report(self, *, urgent: bool) -> None:
        if self.epoch is None:
            return
        reading = self._reading_s + (time.monotonic() - self._read_from)
        rate = None
        processed = self._cursor.processed
        if reading > 0 and processed > self._counted_since:
            rate = (processed - self._counted_since) / reading
        self.tracker.want_report(self.epoch, rate, urgent)

    def _wait(self, predicate: Callable[[], bool], what: str) -> None:
        self._reading_s += time.monotonic() - self._read_from
        try:
            ok = self.tracker.wait(predicate, self.wait_s)
        finally:
            self._read_from = time.monotonic()
        if not ok:
            raise TimeoutError(
                f"rank {self.tracker.rank}: waited {self.wait_s} s for {what}; "
                f"last error: {self.tracker.error or 'none'}"
            )
