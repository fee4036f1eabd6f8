"""The execution host: the one place where the pure fold meets the log, the clock and the network.

It reads like etcd raft's application loop. One asyncio task drives the host core
(``core.py``'s :class:`~coordinator.host.core.HostCore`: the fold and all the host derives from
it, decided without I/O or a clock; the simulator drives the same core), and each turn of
:meth:`Host._run` is

1. **batch**: take what is queued (``batching.take_batch`` says what may share a batch) and
   admit it (``batching.Admission``): each input pre-checked against the fold, so a refused
   one is answered at once and never appended, and heartbeats gathered into shared records;
2. **append** the admitted inputs in one batch (a group commit, durable when it returns);
3. **step** the fold over those records in offset order, which gives one
   :class:`~coordinator.host.ready.Ready` value (``ready.ReadyBuilder``);
4. **carry out** the Ready: projection rows written with the consumer offset (before anything
   that depends on them is answered), the read model published (``reads``: what the API
   reads, one whole cycle at a time), agent updates published and long polls woken (answered
   in shares while inputs wait: ``pacing``), waiting proposals answered, then the inputs
   (the decisions before the shared heartbeat records: ``batching.decisions_first``);
   now and then a snapshot (``snapshots``), so a restart replays only a short tail.

Time enters the fold only as record timestamps: the host stamps each batch with the writer's
clock, and a ticker (``ticks``) appends a ``tick`` once ``next_deadline()`` has passed.
Responses are served from the fold's in-memory state (the API's reads from the read model the
loop publishes after each cycle); the log, not this object, is the source of truth, and a restart rebuilds everything here from the latest snapshot plus the tail.

Whether the host leads at once or only while it holds a lease is its :class:`Role`
(:class:`SoleLeader`, ``replica.Replica``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from ...eventlog import Log, LogError, NewRecord, Record, StaleTermError, open_log
from ...eventlog.record import READ_PAGE, Encoded
from ...wire.codes import (
    CARRY_OUT_FAILED,
    CLOSED,
    FOLD_FAILED,
    LOG_UNAVAILABLE,
    NOT_LEADER,
    TERMINAL,
)
from ..fold.effects import Effect, Proposal
from ..fold.machine import Coordinator
from ..fold.registry import Facets
from .batching import MAX_BATCH
from .core import FoldFailed, HostCore
from .inputs import (
    Appended,
    Beats,
    Existing,
    HostUnavailable,
    Input,
    Outcome,
    Precheck,
    Refusal,
    Reply,
    queue_submission,
)
from .metrics import HostMetrics
from .pacing import PollPacing
from .polls import UpdatesAnswer
from .reads import Reads
from .ready import HostState, Ready
from .rows import ProjectionRows
from .snapshots import (
    CONSUMER,
    SNAPSHOT_BEATS,
    SNAPSHOT_EVERY,
    SNAPSHOT_FORMAT,
    SNAPSHOT_INTERVAL_S,
    Snapshots,
    restore_state,
)
from .ticks import Ticker

__all__ = [
    "CONSUMER",
    "SNAPSHOT_FORMAT",
    "Appended",
    "Existing",
    "Host",
    "HostUnavailable",
    "Outcome",
    "Precheck",
    "Refusal",
    "Role",
    "SoleLeader",
    "UpdatesAnswer",
]

log = logging.getLogger("foldplane.host")

#: How long, at most, a ``shutdown_with_save`` waits for its checkpoint rank to be handed it
#: before the group's other ranks get it too (a live rank's agent polls at all times, so it is
#: handed the directive within a round trip; this bounds a checkpoint rank that is hung or
#: dead but not yet OFFLINE).
SHUTDOWN_LEAD_S = 2.0

#: How many queued inputs (beats of as many host batches) wake the loop even before the oldest
#: of them is due: few enough that admitting them is a short turn at any group size.
QUEUED_BEATS_WAKE = 256


class Role(Protocol):
    """What differs between a coordinator that leads for good and one that leads only while it
    holds a lease. The host calls its role when it starts, before and after each long poll, and
    when it closes; the role drives the host only through its public methods (``serve``,
    ``stop_serving``, ``catch_up``, ``set_unavailable``, ``projections``)."""

    #: "leader" or "standby"
    name: str
    #: the leader's address when this coordinator knows it and does not lead
    leader: str | None
    #: how long a host's channel may hear nothing from this coordinator before the host looks
    #: for another leader (the lease: a leader silent that long cannot have renewed it); None
    #: where there is no other coordinator to look for
    liveness_s: float | None

    def attach(self, host: Host) -> None:
        """The host this role drives (called once, when the host is built)."""

    def start(self) -> None:
        """Start: serve at once, or follow until leading."""

    def check_polls(self, why: str) -> None:
        """Raise the reason long polls cannot be answered here (``why`` names the moment)."""

    async def stop(self) -> None:
        """The host is closing: stop whatever the role runs."""

    async def closed(self) -> None:
        """The host is closed: release what the role holds."""


class SoleLeader:
    """The only coordinator of its log: it claimed the term on open and serves at once."""

    name = "leader"
    leader: str | None = None
    liveness_s: float | None = None

    def __init__(self) -> None:
        self.host: Host | None = None

    def attach(self, host: Host) -> None:
        self.host = host

    def start(self) -> None:
        assert self.host is not None
        self.host.serve()

    def check_polls(self, why: str) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def closed(self) -> None:
        return None


class Host:
    """Runs the fold over the log and carries out its effects; see the module docstring."""

    def __init__(
        self,
        log_: Log,
        machine: Coordinator,
        state: HostState,
        *,
        projected: int,
        snapshot_every: int = SNAPSHOT_EVERY,
        snapshot_beats: int = SNAPSHOT_BEATS,
        snapshot_interval_s: float = SNAPSHOT_INTERVAL_S,
        max_batch: int = MAX_BATCH,
        poll_release: int = 8,
        poll_spread: int = 8,
        heartbeat_flush_s: float = 0.5,
        shutdown_lead_s: float = SHUTDOWN_LEAD_S,
        role: Role | None = None,
    ) -> None:
        self.log = log_
        self.metrics = HostMetrics()
        #: the fold and all the host derives from it, decided without I/O (``core.py``): the
        #: one core this loop drives, as the simulator does
        self.core = HostCore(
            machine, state, heartbeat_flush_s=heartbeat_flush_s, metrics=self.metrics
        )
        self.machine = machine
        #: the facets this host runs (``coordinator.fold.registry.Facets``): its log accepts
        #: their kinds, its API reads their events
        self.facets = machine.composition
        log_.accept(self.facets.kinds)
        #: the host's own derived state (in the snapshot)
        self.state = state
        self.journals = self.core.journals
        #: what the API reads of the fold (``reads.py``), published once per cycle: never
        #: the machine itself
        self.published = self.core.published
        self.ready_builder = self.core.ready_builder
        self.store_address: dict[str, Any] | None = None
        self.projections = ProjectionRows(log_, projected=projected)
        self.snapshots = Snapshots(
            log_,
            self.metrics,
            offset=machine.offset,
            every=snapshot_every,
            beats=snapshot_beats,
            interval_s=snapshot_interval_s,
        )
        self.pacing = PollPacing(release=poll_release, spread=poll_spread)
        if not shutdown_lead_s >= 0:
            raise ValueError(f"shutdown_lead_s must be >= 0 seconds, got {shutdown_lead_s}")
        self._shutdown_lead_s = shutdown_lead_s
        #: the inputs waiting for the loop, in arrival order
        self.queue = self.core.queue
        self.admission = self.core.admission
        self._max_batch = max_batch
        self._has_input = asyncio.Event()
        #: the timer that wakes the loop when the oldest beats queued without waking it are
        #: due (see ``_enqueue``)
        self._beats_wake: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        self._proposal_waiters: dict[int, list[asyncio.Future[Proposal]]] = defaultdict(list)
        #: who hears of each effect of ``Ready.notices`` once its batch is carried out (a
        #: facet's calls waiting in this process: the lighthouse's quorum calls)
        self.listeners: list[Callable[[Effect], None]] = []
        self._last_ts = 0
        self._unavailable: HostUnavailable | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        self._batch_idle = asyncio.Event()
        self._batch_idle.set()
        #: How many records the last restore folded after the snapshot (the tail).
        self.replayed_on_start = 0
        #: whether it leads at once or only while it holds a lease (``role.name``: "leader" or
        #: "standby"; ``role.leader``: the leader's address as far as a standby knows it)
        self.role: Role = role if role is not None else SoleLeader()
        self.role.attach(self)

    @property
    def reads(self) -> Reads:
        """The read model of the last cycle carried out (``reads.py``): all the API reads of
        the fold."""
        return self.published.current

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        target: str,
        *,
        adopt_empty: bool = False,
        facets: Facets | None = None,
        **options: Any,
    ) -> Host:
        """Open the log, claim its term, restore the snapshot, replay the tail and start.
        ``adopt_empty``: a new log may be made in an empty file (``open_log``); ``facets``:
        the ones it runs (the command line's when None)."""
        log_ = await open_log(target, adopt_empty=adopt_empty)
        try:
            await log_.claim_term()
            host = await cls.restore(log_, facets=facets, **options)
        except BaseException:
            await log_.close()
            raise
        host.start()
        return host

    @classmethod
    async def restore(cls, log_: Log, *, facets: Facets | None = None, **options: Any) -> Host:
        """Build a host of ``facets`` (the command line's when None) from the latest snapshot
        (if it can be read) plus the log's tail."""
        machine, state = await restore_state(log_, facets)
        projected = await log_.get_consumer_offset(CONSUMER)
        host = cls(log_, machine, state, projected=projected, **options)
        await host.catch_up()
        host.replayed_on_start = host.machine.offset - host.snapshots.offset
        log.info(
            "restored at offset %d (snapshot at %d, projections at %d, term %d)",
            host.machine.offset,
            host.snapshots.offset,
            projected,
            log_.term,
        )
        return host

    def start(self) -> None:
        """Start as the role says: serve at once (see :meth:`serve`), or follow until leading."""
        self.role.start()

    def serve(self) -> None:
        """Start the loop and the ticker, and first a ``tick`` with ``{"resumed": true}``.

        While no coordinator served, no rank could reach one, so deadlines computed before the
        outage must not fire on the first tick after it (every rank OFFLINE, the group shut
        down). The resumed tick tells the fold, through the log, to restart them from its
        ``ts``; it is the first input of this term's loop, so it precedes every deadline tick.
        Nothing is appended when no deadline waits on the ranks (a fresh log, a group with no
        rank yet).
        """
        loop = asyncio.get_running_loop()
        if self.machine.waits_on_ranks():
            resumed = self._enqueue(
                [NewRecord(kind="tick", group=None, payload={"resumed": True})], None, None
            )
            resumed.add_done_callback(_ignore_outcome)
        ticker = Ticker(self.machine.next_deadline, self._tick, self._changed)
        self._tasks = [loop.create_task(self._run()), loop.create_task(ticker.run(HostUnavailable))]

    async def stop_serving(self, why: HostUnavailable) -> None:
        """Stop taking inputs (``why``, unless a worse reason than ``not_leader`` stands):
        queued inputs, waiting proposals and long polls get it; the batch in flight finishes,
        so the loop and whoever steps the fold next never both step it; then the loop and the
        ticker end."""
        if self._unavailable is None or self._unavailable.code == NOT_LEADER:
            self._unavailable = why
        self._fail_queued(self._unavailable)
        for waiters in self._proposal_waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(self._unavailable)
        await self._batch_idle.wait()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def set_unavailable(self, why: HostUnavailable | None) -> None:
        """Refuse inputs with ``why`` from now on; None: take them."""
        self._unavailable = why

    async def close(self, *, snapshot: bool = True) -> None:
        """Stop taking inputs, answer the queued ones with ``closed``, snapshot, close the log."""
        await self.role.stop()
        try:
            await self._shut_down(snapshot)
        finally:
            await self.role.closed()

    async def _shut_down(self, snapshot: bool) -> None:
        if self._unavailable is None:
            self._unavailable = HostUnavailable(CLOSED, "the coordinator is shutting down")
        self._fail_queued(self._unavailable)
        # Let the batch in flight finish: its inputs get their answers, and the fold and the
        # log agree when the final snapshot is taken.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._batch_idle.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_queued(self._unavailable)
        self.journals.wake_all()
        with contextlib.suppress(Exception):
            await self.snapshots.settle()  # a snapshot already being written lands
            if snapshot and self._unavailable.code == CLOSED and not self.projections.unwritten:
                await self.snapshots.take(self.machine, self.state)
        await self.log.close()

    # -- inputs ----------------------------------------------------------------------------------

    @property
    def applied_offset(self) -> int:
        """The offset up to which every effect has been carried out."""
        return self.core.applied

    def stop_waiting(self) -> None:
        """Answer every long poll now (empty) and every later one at once: the server is
        shutting down and its connections should drain without waiting out their timeouts."""
        self._draining = True
        self.journals.wake_all()

    @property
    def draining(self) -> bool:
        """Whether long polls are answered at once (:meth:`stop_waiting`): a facet's own long
        polls stop waiting too."""
        return self._draining

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    def available(self) -> HostUnavailable | None:
        """None while the host takes inputs; otherwise why it does not."""
        return self._unavailable

    async def submit(
        self,
        record: NewRecord,
        *,
        key: tuple[Any, ...] | None = None,
        precheck: Precheck | None = None,
    ) -> Outcome:
        """Append one input through the loop and return what became of it."""
        [outcome] = await self._enqueue([record], key, precheck)
        return outcome

    async def submit_many(
        self, records: Sequence[NewRecord], *, normalized: bool = False
    ) -> list[Outcome]:
        """Several inputs at once (an agent host's batch); one outcome per input, in order.

        ``normalized``: each payload already equals what decoding its JSON gives back (plain
        dicts with str keys, lists, str, int, bool, None; ``msgspec.to_builtins`` of a
        validated request gives that), so the fold can take it as it is instead of a decoded
        copy. Only the order of keys may differ (the log stores them sorted), and the fold
        never depends on it.
        """
        return await self._enqueue(records, None, None, normalized=normalized)

    def enqueue_many(
        self, records: Sequence[NewRecord], *, normalized: bool = False
    ) -> asyncio.Future[list[Outcome]]:
        """:meth:`submit_many` without the coroutine: the future of its outcomes, for a caller
        that answers from a callback (``api.server``'s path for agent events). Raises
        :class:`HostUnavailable` at once, before anything is queued, if the host takes no
        inputs."""
        return self._enqueue(records, None, None, normalized=normalized)

    def _enqueue(
        self,
        records: Sequence[NewRecord],
        key: tuple[Any, ...] | None,
        precheck: Precheck | None,
        *,
        normalized: bool = False,
    ) -> asyncio.Future[list[Outcome]]:
        if self._unavailable is not None:
            raise self._unavailable
        loop = asyncio.get_running_loop()
        reply = Reply(loop.create_future(), len(records))
        queue = self.queue
        before = len(queue)
        now = loop.time()
        queue_submission(
            queue, records, reply, key, precheck, now, normalized=normalized, facets=self.facets
        )
        if len(queue) == before:
            return reply.future  # every record was answered at once (invalid)
        flush_s = self.admission.beats.flush_s
        if (
            flush_s > 0
            and len(queue) < QUEUED_BEATS_WAKE
            and all(self._all_current(queue[i].beats) for i in range(before, len(queue)))
        ):
            # Nothing but current beats: they wait for a shared record anyway, so the loop
            # need not wake for them until the oldest queued one is due, another input wakes
            # it, or QUEUED_BEATS_WAKE hosts' beats wait: those that arrive meanwhile are
            # admitted in one turn, and no turn admits more than that many hosts' beats at once.
            # A beat the fold would refuse (a stale incarnation, an OFFLINE rank) wakes it now:
            # its refusal is answered at once, not at the flush.
            if self._beats_wake is None:
                self._beats_wake = loop.call_at(now + flush_s, self._has_input.set)
            return reply.future
        self._has_input.set()
        return reply.future

    def _all_current(self, beats: Beats | None) -> bool:
        """A bundle of beats the fold accepts as it stands (one test each; a bundle with a
        caller's own check is checked in the loop, as it always is)."""
        return beats is not None and (
            beats.precheck is not None
            or not self.machine.beats_not_current(beats.group, beats.ranks, beats.payloads)
        )

    async def wait_proposal(self, proposal_id: int, timeout: float) -> Proposal | None:
        """The proposal once terminal, or as it stands when ``timeout`` seconds have passed."""
        proposal = self.reads.proposal(proposal_id)
        if proposal is None or proposal.status in TERMINAL or timeout <= 0:
            return proposal
        future: asyncio.Future[Proposal] = asyncio.get_running_loop().create_future()
        waiters = self._proposal_waiters[proposal_id]
        waiters.append(future)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return self.reads.proposal(proposal_id)
        finally:
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._proposal_waiters.pop(proposal_id, None)

    async def updates(
        self,
        group: str,
        ranks: Sequence[int],
        after: int,
        timeout: float,
        *,
        view: int | None = None,
    ) -> UpdatesAnswer:
        """What concerns ``ranks`` of ``group`` after ``after`` (the group's updates once, and
        each rank's own): at once if there is any, else at the first publish for the group,
        else empty at ``timeout``. ``view`` is the version the reader holds, so a resync can
        leave out a full view it already has. Only a leader answers (see :class:`Role`)."""
        self.role.check_polls("not leading")
        await self.check_reader_ahead(after)
        answer = await self._updates(group, ranks, after, timeout, view=view)
        self.role.check_polls("stepped down")
        return answer

    async def check_reader_ahead(self, after: int) -> None:
        """A reader that resumes past this fold (``after`` beyond ``applied``) has read a log
        this coordinator has not folded. The log decides what that means: if it ends before
        ``after``, it was restored from an older copy and the reader resyncs
        (:meth:`updates_now`); if it holds ``after``, another coordinator appended it, and this
        one led before and has not yet learnt that it lost the lease (it was paused, and runs
        again): it must not answer from its fold, which the reader would take for a restored
        log, dropping its view for an older one. Raises ``HostUnavailable`` (``not_leader``:
        the reader tries the other coordinators; ``log_unavailable`` when the log's head cannot
        be read). One read of the head, only for such a reader."""
        applied = self.core.applied
        if after <= applied:
            return
        try:
            head = await self.log.head()
        except LogError as exc:
            raise HostUnavailable(
                LOG_UNAVAILABLE,
                f"a reader resumes after offset {after}, past this coordinator's fold "
                f"({applied}), and the log's head cannot be read to tell why: {exc}",
            ) from None
        applied = self.core.applied  # the fold may have moved during the read
        if after <= applied or head < after:
            return  # caught up meanwhile, or the log is behind the reader: updates_now says
        log.warning(
            "a reader resumes after offset %d, which the log holds (head %d) and this "
            "coordinator has not folded (%d): another coordinator led meanwhile; "
            "answering not_leader",
            after,
            head,
            applied,
        )
        raise HostUnavailable(
            NOT_LEADER,
            f"this coordinator's fold ends at offset {applied}, before offset {after} that "
            f"the reader has read and the log holds (head {head}): another coordinator "
            "leads, or led while this one was paused",
        )

    async def _updates(
        self,
        group: str,
        ranks: Sequence[int],
        after: int,
        timeout: float,
        *,
        view: int | None = None,
    ) -> UpdatesAnswer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        journals = self.journals
        while True:
            answer = self.updates_now(group, ranks, after, view=view)
            if answer is not None:
                return answer
            remaining = deadline - loop.time()
            if remaining <= 0 or self._unavailable is not None or self._draining:
                # never past a shutdown held for another rank (``journal.py``)
                horizon = journals.horizon(group, ranks, self.core.applied)
                return UpdatesAnswer([], max(after, horizon), False)
            # nothing runs between the check above and registering here, so no publish is missed
            waiter = journals.waiter(group)
            expiry = loop.call_later(remaining, _expire, waiter)
            try:
                await waiter
            finally:
                expiry.cancel()
                journals.forget(group, waiter)

    def updates_now(
        self, group: str, ranks: Sequence[int], after: int, *, view: int | None = None
    ) -> UpdatesAnswer | None:
        """What concerns ``ranks`` of ``group`` after ``after`` as it stands: the updates, a
        resync, or None when nothing is there yet (the reader then waits on
        ``journals.waiter(group)``: the long poll, and the host channel's pushes)."""
        if after > self.core.applied:
            # The reader has seen offsets this log never reached: the log was restored from an
            # older copy. Nothing after ``after`` will ever come; the core resyncs the reader.
            log.warning(
                "an agent of group %r resumes after offset %d, past this log's head %d: "
                "the log was restored from an older copy; the agent resyncs",
                group,
                after,
                self.core.applied,
            )
        return self.core.updates_now(group, ranks, after, view=view)

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        """batch -> append -> step -> carry out one Ready, until cancelled."""
        while True:
            batch = await self._next_batch()
            if batch is None:
                continue
            self._batch_idle.clear()
            try:
                await self._cycle(batch)
            finally:
                self._batch_idle.set()

    async def _cycle(self, batch: list[Input]) -> None:
        """One turn: admit, append, step, carry out the Ready, answer each input."""
        accepted = self.core.admit(batch, asyncio.get_running_loop().time())
        if not accepted:
            return
        appended = await self._append(accepted)
        if appended is None:
            return  # the inputs were answered with why
        offsets, records = appended
        try:
            ready = self._step(records, live=True)
            await self._carry_out(ready)
        except Exception:  # the step and the carry-out each stop the host when they fail
            for item in accepted:
                item.fail(self._unavailable or HostUnavailable(FOLD_FAILED, "the fold failed"))
            return
        self._answer(accepted, offsets, ready)
        self._maybe_snapshot()

    async def _next_batch(self) -> list[Input] | None:
        """Answer (a share of) the woken long polls, wait for inputs or for buffered beats to
        fall due, and take one batch; None when nothing is to be appended yet."""
        beats_due = self.admission.beats.deadline()
        if self.journals.releasing:
            self.pacing.answer(self.journals, inputs_waiting=self._next_turn_at_once(beats_due))
        if beats_due is None:
            await self._has_input.wait()
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(beats_due):
                    await self._has_input.wait()
        batch = self.core.take(self._max_batch)
        if not self.queue:
            self._has_input.clear()
            if self._beats_wake is not None:
                self._beats_wake.cancel()
                self._beats_wake = None
        if batch or (beats_due is not None and asyncio.get_running_loop().time() >= beats_due):
            return batch
        return None

    def _next_turn_at_once(self, beats_due: float | None) -> bool:
        """Whether the loop takes its next batch without waiting: an input that woke it is
        queued, or buffered beats are due. Beats queued without waking it (``_enqueue``) do not
        count: they wait for their shared record anyway, and a share of the woken polls held
        back for them would wait with them, up to ``heartbeat_flush_s``, with nothing served
        in between (a committed view reaching most hosts a flush late)."""
        if self._has_input.is_set():
            return True
        return beats_due is not None and asyncio.get_running_loop().time() >= beats_due

    async def _append(self, accepted: list[Input]) -> tuple[list[int], list[Record]] | None:
        """Append the admitted inputs in one batch: their offsets and the records to fold
        (others' too, if somebody else appended meanwhile); None when the append failed and
        the inputs were answered with why."""
        ts = self._next_ts()
        try:
            # validated and encoded on arrival (_enqueue): the log does not encode them again
            offsets, checksums = await self.log.append_sealed(
                [
                    Encoded(msgspec.structs.replace(i.record, ts=ts), i.payload_bytes)
                    for i in accepted
                ]
            )
        except StaleTermError as exc:
            self._stop(HostUnavailable(NOT_LEADER, str(exc)), accepted)
            return None
        except LogError as exc:
            log.error("append of %d records failed: %s", len(accepted), exc)
            for item in accepted:
                item.fail(HostUnavailable(LOG_UNAVAILABLE, str(exc)))
            await self._recover()
            return None
        expected = list(range(self.machine.offset + 1, self.machine.offset + 1 + len(accepted)))
        if offsets == expected:
            term = self.log.term
            records = [
                _record(off, ts, term, i.record, crc)
                for off, i, crc in zip(offsets, accepted, checksums, strict=True)
            ]
        else:  # somebody else appended too: fold exactly what the log holds
            records = await self._read_through(offsets[-1])
        return offsets, records

    def _step(self, records: Sequence[Record], *, live: bool = False) -> Ready:
        """Step the fold over durable records (``HostCore.step``): their effects as one Ready.
        ``live``: inputs decided now, whose decisions are logged (not a catch-up's)."""
        try:
            return self.core.step(records, projected=self.projections.projected, live=live)
        except FoldFailed as exc:  # a bug in the fold: stop before the state diverges further
            log.exception("the fold failed at offset %d", exc.offset)
            self._stop(HostUnavailable(FOLD_FAILED, str(exc)), [])
            raise

    async def _carry_out(self, ready: Ready) -> None:
        """Carry out one Ready, in its order: the updates published (readers see them only at
        the wake below), the projection rows written, the read model published and long
        polls woken (``HostCore.carried_out``), proposals answered.

        A failed write of the rows is the log's (kept, written with the next batch: ``rows.py``).
        Any other error leaves the fold ahead of what was carried out: the journals, the read
        model (which admission's prechecks read) and the waiters no longer follow it. The host
        stops, as when the fold fails (``carry_out_failed``; a restart folds the log again and
        derives all of it afresh), and the error is logged with its traceback."""
        try:
            await self._carry_out_parts(ready)
        except Exception as exc:
            log.exception("carrying out the effects up to offset %d failed", ready.offset)
            why = f"carrying out the effects up to offset {ready.offset} failed: {exc!r}"
            self._stop(HostUnavailable(CARRY_OUT_FAILED, why), [])
            raise

    async def _carry_out_parts(self, ready: Ready) -> None:
        journals = self.journals
        for group, rank, offset in ready.saver_first:
            # the checkpoint rank hears of the shutdown first; the rest once it has, or at the
            # bound (``journal.py``)
            journals.hold(group, rank, offset)
            asyncio.get_running_loop().call_later(self._shutdown_lead_s, journals.let_go, group)
        self.core.publish_updates(ready)
        self.projections.add(ready.rows)
        await self.projections.write(ready.offset)
        self.core.carried_out(ready)
        for proposal in ready.resolved:
            for future in self._proposal_waiters.pop(proposal.id, []):
                if not future.done():
                    future.set_result(proposal)
        for effect in ready.notices:
            for listener in self.listeners:
                listener(effect)
        self._changed.set()

    def _answer(self, accepted: list[Input], offsets: list[int], ready: Ready) -> None:
        """Each input its outcome (``HostCore.answer``)."""
        self.core.answer(accepted, offsets, ready, asyncio.get_running_loop().time())

    def _maybe_snapshot(self) -> None:
        """Start a snapshot when one is due, none is being written, and every projection row
        up to the fold's offset is written (see :meth:`Snapshots.maybe_start`)."""
        if not self.projections.unwritten:
            self.snapshots.maybe_start(self.machine, self.state)

    def _next_ts(self) -> int:
        """The writer clock for a batch, never behind the last record (a clock step back would
        otherwise move the fold's time backwards)."""
        self._last_ts = max(time.time_ns(), self._last_ts)
        return self._last_ts

    async def _tick(self) -> None:
        await self.submit(NewRecord(kind="tick", group=None, payload={}))

    async def _read_through(self, until: int) -> list[Record]:
        out: list[Record] = []
        while self.machine.offset + len(out) < until:
            after = out[-1].offset if out else self.machine.offset
            page = await self.log.read(after=after, limit=1000, until=until)
            if not page:
                break
            out.extend(page)
        return out

    async def catch_up(self) -> None:
        """Fold every record the log holds beyond the fold's offset (start, a standby following
        the leader, or after an error)."""
        while True:
            page = await self.log.read(after=self.machine.offset, limit=READ_PAGE)
            if not page:
                break
            if page[-1].offset - self.machine.offset != len(page):
                # offsets are gap-free but where compaction removed records: folding across
                # them would silently give another state, so stop and say why
                raise LogError(
                    f"records after offset {self.machine.offset} of {self.log.where} were "
                    "removed by compaction before this coordinator folded them; restart it "
                    "to restore from the kept snapshot"
                )
            self._last_ts = max(self._last_ts, page[-1].ts)
            await self._carry_out(self._step(page))
            self.journals.release()  # nothing waits behind these: answer every woken poll
        self.core.applied = self.machine.offset

    async def _recover(self) -> None:
        """After a failed append the batch may or may not be durable: read back what is."""
        try:
            await self.catch_up()
        except LogError as exc:
            log.error("cannot read the log back after a failed append: %s", exc)

    def _stop(self, why: HostUnavailable, inflight: list[Input]) -> None:
        log.error("the host stops taking inputs: %s", why.detail)
        self._unavailable = why
        for item in inflight:
            item.fail(why)
        self._fail_queued(why)

    def _fail_queued(self, why: HostUnavailable) -> None:
        while self.queue:
            self.queue.popleft().fail(why)
        self.admission.beats.drain(lambda beat: beat.fail(why))
        self.journals.wake_all()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _ignore_outcome(future: asyncio.Future[list[Outcome]]) -> None:
    """The resumed tick has no caller: a host that stops before appending it starts over with
    another one, so its failure is only retrieved (asyncio would log it as unhandled)."""
    if not future.cancelled():
        future.exception()


def _record(offset: int, ts: int, term: int, rec: NewRecord, crc: int) -> Record:
    """The record the log now holds, built locally instead of read back (``crc``: the
    checksum the writer stored it with)."""
    return Record(
        offset=offset,
        ts=ts,
        term=term,
        kind=rec.kind,
        group=rec.group,
        rank=rec.rank,
        payload=rec.payload,
        checksum=crc,
    )
