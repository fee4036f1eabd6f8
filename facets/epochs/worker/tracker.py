"""What the coordinator said about this rank's epochs (docs/data.md): the plans, this rank's
part of each (``Part``), the epochs' ends, and the progress it reports through the agent, one
report in flight, the newest replacing one not yet sent (the epochs facet's worker part,
``worker/``; the sampler, ``sampler.py``, reads it).

The count follows the part (``cursor.ReadCursor``, kept by the tracker and moved with every
change of the part under the same lock): a position yielded from a share this rank no longer
holds (a deactivation took it, a resync replaced it) counts nothing when it is marked, so
every report counts positions of the part it is sent against and a late mark is never
credited to a share given after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ....wire.codes import NOT_JOINED, RANK_OFFLINE, STALE_ASSIGNMENT
from ..cursor import PartMismatch, ReadCursor, apply_moves
from ..protocol import (
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
    EpochPlanUpdate,
)

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
