"""What goes into one append: which queued inputs may share a batch, what of a batch is appended
(each input pre-checked, heartbeats gathered into shared records), and in which order its inputs
are answered once it is durable.

All are decisions without I/O: :func:`take_batch` reads the queue, :class:`Admission` reads the
fold's state before the batch, :func:`decisions_first` reads the batch appended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ...eventlog import NewRecord
from ...eventlog.record import decode_payload, validate
from ...wire import ranks as rank_sets
from ..fold.heartbeats import HeartbeatBuffer
from ..fold.machine import Coordinator
from .inputs import Beats, Existing, Input, Outcome, Refusal, SharedReply
from .metrics import HostMetrics
from .reads import Reads, ReadsPublisher

#: How many inputs one append takes at most, by default.
MAX_BATCH = 4096
#: Inputs that change what the fold accepts from their rank (see :func:`take_batch`).
RANK_CHANGING = frozenset({"join", "exit", "death_reported"})


def take_batch(queue: deque[Input], max_batch: int) -> list[Input]:
    """Take queued inputs for one append, in arrival order (at most ``max_batch``).

    The fold pre-checks a whole batch against the state *before* it, so two inputs that
    could change each other's verdict must not share a batch. Such an input is deferred to
    the next batch (it stays at the front of ``queue``), and so is every later input it must
    stay behind:

    - a ``join``, ``exit`` or ``death_reported`` changes what the fold accepts from its
      rank, so it shares no batch with any other input of that rank (a join of a new
      incarnation, then a heartbeat from the old one);
    - a second proposal with the same idempotency key waits for the first;
    - a second start of the same refit transfer waits for the first (``queue_submission``
      keys an agent's ``transfer`` as the operator's route keys it): every publisher of a
      refit may ask for it, often at the same moment, and only against the state after the
      first is the second a repeat (else the fold would take it for a retry and start another
      attempt);
    - anything for a group waits for the batch that creates the group.

    Heartbeats, links and ACKs of one rank do not change each other's verdicts, so they
    share batches; that keeps barriers (an ACK per rank beside its heartbeats) from cutting
    the group commit into small pieces. Abandoned inputs (the caller went away) are dropped.
    """
    batch: list[Input] = []
    deferred: list[Input] = []
    keys: set[tuple[Any, ...]] = set()
    # The ranks of the batch so far; only a rank-changing input reads it, so it is built at the
    # first input that is not a plain one (no key, not rank-changing, not a creation). Until
    # then every set here is empty, and a plain input simply joins the batch: nearly every
    # batch is beats only.
    touched: set[tuple[str | None, int]] | None = None
    changed: set[tuple[str | None, int]] = set()
    blocked: set[tuple[str | None, int]] = set()
    created: set[str | None] = set()
    blocked_groups: set[str | None] = set()
    while queue and len(batch) < max_batch:
        item = queue.popleft()
        if item.abandoned:
            continue
        rec = item.record
        key = item.key
        changes_rank = rec.kind in RANK_CHANGING
        if touched is None:
            if not changes_rank and key is None and rec.kind != "group_created":
                batch.append(item)
                continue
            touched = {rank for i in batch for rank in _ranks_of(i)}
        ranks = _ranks_of(item)
        if (
            rec.group in created
            or rec.group in blocked_groups
            or (key is not None and key in keys)
            or any(
                rank in blocked or rank in changed or (changes_rank and rank in touched)
                for rank in ranks
            )
        ):
            deferred.append(item)
            blocked.update(ranks)
            if key is not None:
                keys.add(key)
            if rec.kind == "group_created":
                blocked_groups.add(rec.group)
            continue
        if key is not None:
            keys.add(key)
        touched.update(ranks)
        if changes_rank:
            changed.update(ranks)
        if rec.kind == "group_created":
            created.add(rec.group)
        batch.append(item)
    queue.extendleft(reversed(deferred))
    return batch


def _ranks_of(item: Input) -> list[tuple[str | None, int]]:
    """The ranks an input is about (a bundle of beats: each beat's)."""
    group = item.record.group
    if item.beats is not None:
        return [(group, rank) for rank in item.beats.ranks]
    return [] if item.record.rank is None else [(group, item.record.rank)]


class Admission:
    """Decides what of a batch is appended, against the fold's state before the batch.

    A refused input is answered at once and never appended, so fenced reports cost no log
    space and no fsync. A heartbeat waits in the :class:`HeartbeatBuffer` for a shared record
    (see ``coordinator.fold.heartbeats``).
    """

    def __init__(
        self,
        machine: Coordinator,
        beats: HeartbeatBuffer[Input],
        metrics: HostMetrics,
        *,
        reads: Callable[[], Reads] | None = None,
    ) -> None:
        self.machine = machine
        #: what a caller's own check reads (``Input.precheck``): the host's published read
        #: model (at a batch's admission, the fold as of the last cycle); by default, for a
        #: fold driven without a host, one built at each check
        self.reads = reads or (lambda: ReadsPublisher(machine).current)
        self.beats = beats
        self.metrics = metrics

    def precheck(self, item: Input) -> Outcome | None:
        """The caller's own check, then the fold's: a repeat of an earlier record is that record
        (``Existing``), a refused input its ``Refusal``; None when the input may go in."""
        if item.precheck is not None and (outcome := item.precheck(self.reads())) is not None:
            return outcome
        rec = item.record
        if rec.kind == "tick":
            return None
        if (
            rec.kind in self.machine.repeatable
            and (earlier := self.machine.repeat_of(rec.kind, rec.group, rec.rank, rec.payload))
            is not None
        ):
            return Existing(earlier)
        refused = self.machine.check(rec.kind, rec.group, rec.rank, rec.payload)
        if refused is None:
            return None
        self.metrics.fenced[refused.code] += 1
        return Refusal(refused.code, refused.message)

    def admit(self, batch: list[Input], now: float) -> list[Input]:
        """What of ``batch`` goes into this append: each input pre-checked (a refused one is
        answered at once), beats set aside to share a record, and the shared records of the
        beats now due put in front. ``now`` is the loop's clock, the heartbeat buffer's."""
        accepted: list[Input] = []
        for item in batch:
            beats = item.beats
            if beats is None:
                rec = item.record
                if rec.kind != "heartbeat" or rec.rank is None or rec.group is None:
                    outcome = self.precheck(item)
                    if outcome is not None:
                        item.answer(outcome)
                    else:
                        accepted.append(item)
                    continue
                beats = _alone(item)  # a beat submitted on its own: a bundle of one
            self.check_beats(beats)
            if beats.ranks:  # due flush_s after they arrived, however long they were queued
                self.beats.add(beats.group, beats, len(beats), min(beats.arrived, now))
        # A tick flushes every waiting beat ahead of it: no rank times out while its beat waits.
        ticking = any(item.record.kind == "tick" for item in accepted)
        shared = [
            item
            for group, waiting in self.beats.take(now, everything=ticking)
            if (item := self.shared_beats(group, waiting)) is not None
        ]
        # Ahead of the batch (they were checked against the state before it), but never ahead
        # of the resumed tick, the first input of a term (see ``Host.start``).
        first = accepted[0].record if accepted else None
        at = int(
            first is not None and first.kind == "tick" and first.payload.get("resumed") is True
        )
        accepted[at:at] = shared
        return accepted

    def check_beats(self, beats: Beats) -> None:
        """Check each beat of a bundle against the fold as it stands: the current ones (nearly
        all) by one test each (``Coordinator.beats_not_current``), the others by the full
        checks; a refused beat is answered at once and leaves the bundle."""
        machine = self.machine
        group = beats.group
        if beats.precheck is None:
            suspects: Iterable[int] = machine.beats_not_current(group, beats.ranks, beats.payloads)
        else:
            suspects = range(len(beats))
        refused: dict[int, Outcome] = {}
        for i in suspects:
            record = NewRecord(
                kind="heartbeat", group=group, rank=beats.ranks[i], payload=beats.payloads[i]
            )
            outcome = self.precheck(Input(record, b"", beats.reply, -1, None, beats.precheck, 0.0))
            if outcome is not None:
                refused[i] = outcome
        if refused:
            beats.refuse(refused)
        beats.checked = machine.fence_epoch(group)

    def shared_beats(self, group: str, waiting: list[Beats]) -> Input | None:
        """One ``heartbeat`` record for the beats of ``group`` that waited together, each
        checked again against the state the record will be folded on (unless nothing that a
        beat's check reads has changed since its first: ``Coordinator.fence_epoch``); None
        when none of them is still current."""
        ranks: set[int] = set()
        kept: list[Beats] = []
        count = 0
        epoch = self.machine.fence_epoch(group)
        for beats in waiting:
            if beats.abandoned:
                continue
            if beats.checked != epoch or beats.precheck is not None:
                self.check_beats(beats)
            if not beats.ranks:
                continue
            kept.append(beats)
            ranks.update(beats.ranks)
            count += len(beats)
        if not kept:
            return None
        record = NewRecord(
            kind="heartbeat", group=group, rank=None, payload={"ranks": rank_sets.encode(ranks)}
        )
        payload_bytes = validate(record)
        record = msgspec.structs.replace(record, payload=decode_payload(payload_bytes))
        self.metrics.heartbeats += count
        arrived = min(beats.arrived for beats in kept)
        return Input(record, payload_bytes, SharedReply(kept), 0, None, None, arrived)


def decisions_first(accepted: list[Input]) -> list[int]:
    """The order in which the inputs of one append are answered: every input that is not a
    heartbeat (ACKs, proposals, joins, deaths: the decisions a barrier or a caller waits on),
    then the shared heartbeat records, each group in append order.

    All of them are durable once the append returns, so answering order guarantees nothing
    about the log; it only decides who waits for whom in the turn that answers. A shared record
    answers the beats of every host that sent some since the last flush (one answer per host
    batch), and a barrier's last ACKs must not wait for those."""
    decisions = [i for i, item in enumerate(accepted) if item.record.kind != "heartbeat"]
    if len(decisions) == len(accepted):
        return decisions
    return decisions + [i for i, item in enumerate(accepted) if item.record.kind == "heartbeat"]


def _alone(item: Input) -> Beats:
    """A heartbeat input as a bundle of its one beat."""
    rec = item.record
    assert rec.group is not None and rec.rank is not None
    beats = Beats(rec.group, item.reply, item.arrived, item.precheck)  # type: ignore[arg-type]
    beats.add(rec.rank, rec.payload, item.index)
    return beats
