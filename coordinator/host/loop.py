"""The execution host: the one place where the pure fold meets the log, the clock and the network.

It reads like etcd-raft's application loop. One asyncio task owns the :class:`Coordinator`:

1. take what is queued (one batch; see :meth:`Host._next_batch` for what may share a batch);
2. pre-check each input against the fold (``check``): a refused input is answered at once and
   never appended, so fenced reports cost no log space and no fsync;
3. append the accepted inputs in one batch (a group commit, durable when ``append`` returns);
4. step the fold over those records in offset order;
5. carry out the effects: projection rows (written with the consumer offset, before anything
   that depends on them is answered), agent update journals and long-polls, waiting proposals;
6. snapshot now and then, so a restart replays only a short tail.

Time enters the fold only as record timestamps: the host stamps each batch with the writer's
clock, and a ticker appends a ``tick`` once ``next_deadline()`` has passed. Responses are served
from the fold's in-memory state; the log, not this object, is the source of truth, and a restart
rebuilds everything here from the latest snapshot plus the tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from coordinator.fold.effects import (
    Effect,
    GroupCreated,
    GroupFailed,
    Proposal,
    ProposalResolved,
    RankState,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from coordinator.fold.fencing import REPEATABLE
from coordinator.fold.heartbeats import HeartbeatBuffer
from coordinator.fold.machine import Coordinator
from coordinator.fold.projections import rank_state_update, rows_for, shutdown_update
from coordinator.host.journal import Update, UpdateJournals, decoded, encoded
from coordinator.host.metrics import HostMetrics
from eventlog import (
    InvalidRecord,
    Log,
    LogError,
    NewRecord,
    ProjectionRow,
    Record,
    StaleTermError,
    open_log,
)
from eventlog.record import READ_PAGE, Encoded, decode_payload, validate
from wire import ranks as rank_sets
from wire.protocol import View, prepare_update, view_update

log = logging.getLogger("foldplane.host")

#: The name under which the host keeps its snapshot and its projection consumer offset.
CONSUMER = "coordinator"
SNAPSHOT_FORMAT = 1
TERMINAL = frozenset({"applied", "applied_with_dropped_ranks", "rejected"})
#: Inputs that change what the fold accepts from their rank (see ``Host._next_batch``).
_RANK_CHANGING = frozenset({"join", "exit", "death_reported"})


# -- what an input gets back ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """The input is durable at ``offset`` and the fold accepted it."""

    offset: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """The input was refused with an error ``code`` (see docs/protocol.md).

    ``offset`` is None when it was refused before the append (the usual case); it is set when the
    fold fenced it while stepping (another input of the same batch made it stale).
    """

    code: str
    detail: str
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Existing:
    """Nothing was appended: an earlier record already answers it (the id of that record)."""

    id: int


Outcome = Appended | Refusal | Existing
Precheck = Callable[[Coordinator], Outcome | None]


class HostUnavailable(Exception):
    """The host cannot take inputs: it is closed, deposed (``not_leader``) or its log failed."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class UpdatesAnswer:
    #: The updates as JSON, in offset order (the journals keep each update encoded once).
    encoded: list[msgspec.Raw]
    next_after: int
    resync: bool
    #: the reader was past the log's head: the log was restored from an older copy
    restored: bool = False

    @property
    def updates(self) -> list[Update]:
        return [decoded(raw) for raw in self.encoded]


class _Reply:
    """The answer to one submission (one request's batch): an outcome per input, then done."""

    __slots__ = ("future", "results", "remaining")

    def __init__(self, future: asyncio.Future[list[Outcome]], n: int) -> None:
        self.future = future
        self.results: list[Any] = [None] * n
        self.remaining = n
        if n == 0:
            future.set_result([])

    def set(self, index: int, outcome: Outcome) -> None:
        if self.future.done():
            return
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def done(self) -> bool:
        return self.future.done()


class _Shared:
    """The reply of a shared heartbeat record: every beat in it gets the record's outcome."""

    __slots__ = ("beats",)

    def __init__(self, beats: list[_Input]) -> None:
        self.beats = beats

    def set(self, index: int, outcome: Outcome) -> None:
        for beat in self.beats:
            beat.answer(outcome)

    def fail(self, exc: BaseException) -> None:
        for beat in self.beats:
            beat.fail(exc)

    def done(self) -> bool:
        return all(beat.abandoned for beat in self.beats)


@dataclass(slots=True)
class _Input:
    record: NewRecord
    payload_bytes: bytes
    reply: _Reply | _Shared
    index: int
    key: tuple[Any, ...] | None
    precheck: Precheck | None
    arrived: float

    @property
    def abandoned(self) -> bool:
        return self.reply.done()

    def answer(self, outcome: Outcome) -> None:
        self.reply.set(self.index, outcome)

    def fail(self, exc: BaseException) -> None:
        self.reply.fail(exc)


@dataclass
class _Aux:
    """Host-side state derived from effects, kept in the snapshot so that a resync after a
    restart can still name the change in flight, each rank's state and a shutdown directive."""

    in_flight: dict[str, Update] = field(default_factory=dict)
    rank_states: dict[str, dict[str, Update]] = field(default_factory=dict)
    shutdown: dict[str, Update] = field(default_factory=dict)
    world_sizes: dict[str, int] = field(default_factory=dict)


class Host:
    """Runs the fold over the log and carries out its effects; see the module docstring."""

    def __init__(
        self,
        log_: Log,
        machine: Coordinator,
        aux: _Aux,
        *,
        projected: int,
        snapshot_every: int = 20_000,
        snapshot_interval_s: float = 30.0,
        max_batch: int = 4096,
        poll_release: int = 8,
        poll_spread: int = 8,
        heartbeat_flush_s: float = 0.5,
    ) -> None:
        self.log = log_
        self.machine = machine
        self.metrics = HostMetrics()
        self.journals = UpdateJournals(floor=machine.offset)
        self.store_address: dict[str, Any] | None = None
        self._aux = aux
        #: each group's last committed view: the base of the next view update (a delta)
        self._views: dict[str, View] = {
            group: view
            for group in machine.groups()
            if (view := machine.current_view(group)) is not None
        }
        for group, size in aux.world_sizes.items():
            self.journals.set_world_size(group, size)
        self._projected = projected
        self._applied = machine.offset
        self._unwritten: dict[tuple[str, str, int], ProjectionRow] = {}
        self._snapshot_every = snapshot_every
        self._snapshot_interval_s = snapshot_interval_s
        self._snapshot_offset = machine.offset
        self._snapshot_time = time.monotonic()
        self._snapshot_writing: asyncio.Task[None] | None = None
        self._max_batch = max_batch
        if poll_release < 1 or poll_spread < 1:
            raise ValueError(
                f"poll_release and poll_spread must be at least 1, got {poll_release} and "
                f"{poll_spread}"
            )
        self._poll_release = poll_release
        self._poll_spread = poll_spread
        self._queue: deque[_Input] = deque()
        self._beats: HeartbeatBuffer[_Input] = HeartbeatBuffer(heartbeat_flush_s)
        self._has_input = asyncio.Event()
        self._changed = asyncio.Event()
        self._proposal_waiters: dict[int, list[asyncio.Future[Proposal]]] = defaultdict(list)
        self._last_ts = 0
        self._unavailable: HostUnavailable | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        self._batch_idle = asyncio.Event()
        self._batch_idle.set()
        #: How many records the last restore folded after the snapshot (the tail).
        self.replayed_on_start = 0

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, target: str, **options: Any) -> Host:
        """Open the log, claim its term, restore the snapshot, replay the tail and start."""
        log_ = await open_log(target)
        try:
            await log_.claim_term()
            host = await cls.restore(log_, **options)
        except BaseException:
            await log_.close()
            raise
        host.start()
        return host

    @classmethod
    async def restore(cls, log_: Log, **options: Any) -> Host:
        """Build a host from the latest snapshot (if it can be read) plus the log's tail."""
        machine, aux = await _restore_state(log_)
        projected = await log_.get_consumer_offset(CONSUMER)
        host = cls(log_, machine, aux, projected=projected, **options)
        await host._catch_up()
        host.replayed_on_start = host.machine.offset - host._snapshot_offset
        log.info(
            "restored at offset %d (snapshot at %d, projections at %d, term %d)",
            host.machine.offset,
            host._snapshot_offset,
            projected,
            log_.term,
        )
        return host

    def start(self) -> None:
        """Start serving: the loop, the ticker, and first a ``tick`` with ``{"resumed": true}``.

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
        self._tasks = [loop.create_task(self._run()), loop.create_task(self._ticker())]

    async def close(self, *, snapshot: bool = True) -> None:
        """Stop taking inputs, answer the queued ones with ``closed``, snapshot, close the log."""
        if self._unavailable is None:
            self._unavailable = HostUnavailable("closed", "the coordinator is shutting down")
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
            if self._snapshot_writing is not None:
                await self._snapshot_writing  # a snapshot already being written lands
            if snapshot and self._unavailable.code == "closed" and not self._unwritten:
                await self._snapshot()
        await self.log.close()

    # -- inputs ----------------------------------------------------------------------------------

    @property
    def applied_offset(self) -> int:
        """The offset up to which every effect has been carried out."""
        return self._applied

    def stop_waiting(self) -> None:
        """Answer every long poll now (empty) and every later one at once: the server is
        shutting down and its connections should drain without waiting out their timeouts."""
        self._draining = True
        self.journals.wake_all()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

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
        reply = _Reply(loop.create_future(), len(records))
        now = loop.time()
        queue = self._queue
        for index, record in enumerate(records):
            if normalized and record.kind == "heartbeat" and record.rank is not None:
                # A beat is never appended as it is: it waits for a shared record, which is
                # validated when it is built. Only the fold's check applies to the beat itself.
                queue.append(_Input(record, b"", reply, index, key, precheck, now))
                continue
            try:
                payload_bytes = validate(record)
            except InvalidRecord as exc:
                reply.set(index, Refusal("invalid_event", str(exc)))
                continue
            if not normalized:
                # What the fold sees must be exactly what a reader of the log decodes.
                record = msgspec.structs.replace(record, payload=decode_payload(payload_bytes))
            queue.append(_Input(record, payload_bytes, reply, index, key, precheck, now))
        self._has_input.set()
        return reply.future

    async def wait_proposal(self, proposal_id: int, timeout: float) -> Proposal | None:
        """The proposal once terminal, or as it stands when ``timeout`` seconds have passed."""
        proposal = self.machine.proposal(proposal_id)
        if proposal is None or proposal.status in TERMINAL or timeout <= 0:
            return proposal
        future: asyncio.Future[Proposal] = asyncio.get_running_loop().create_future()
        waiters = self._proposal_waiters[proposal_id]
        waiters.append(future)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return self.machine.proposal(proposal_id)
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
        leave out a full view it already has."""
        if after > self._applied:
            # The reader has seen offsets this log never reached: the log was restored from an
            # older copy. Nothing after ``after`` will ever come; start the reader afresh.
            log.warning(
                "an agent of group %r resumes after offset %d, past this log's head %d: "
                "the log was restored from an older copy; the agent resyncs",
                group,
                after,
                self._applied,
            )
            return self._resync(group, ranks, None, restored=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        journals = self.journals
        while True:
            got = journals.entries_since(group, ranks, after)
            if got is None:
                return self._resync(group, ranks, view)
            if got:
                next_after = got[-1][0]
                journals.mark_delivered(group, ranks, next_after)
                return UpdatesAnswer([raw for _, raw in got], next_after, False)
            remaining = deadline - loop.time()
            if remaining <= 0 or self._unavailable is not None or self._draining:
                return UpdatesAnswer([], max(after, self._applied), False)
            # nothing runs between the check above and registering here, so no publish is missed
            waiter = journals.waiter(group)
            expiry = loop.call_later(remaining, _expire, waiter)
            try:
                await waiter
            finally:
                expiry.cancel()
                journals.forget(group, waiter)

    def _resync(
        self, group: str, ranks: Sequence[int], view: int | None, *, restored: bool = False
    ) -> UpdatesAnswer:
        """The current state instead of the updates the journal no longer holds: the view (in
        full, as a delta from nothing, unless the reader already holds its version), the
        change in flight, each rank's state and the shutdown directive."""
        self.metrics.resyncs += 1
        updates: list[Update] = []
        current = self.machine.current_view(group)
        if current is not None and current.version != view:
            updates.append(view_update(None, current))
        prepare = self._aux.in_flight.get(group)
        if prepare is not None and (current is None or prepare["version"] > current.version):
            updates.append(prepare)
        states = self._aux.rank_states.get(group, {})
        for rank in ranks:
            state = states.get(str(rank))
            if state is not None:
                updates.append(state)
        shutdown = self._aux.shutdown.get(group)
        if shutdown is not None:
            updates.append(shutdown)
        updates.sort(key=lambda u: u["offset"])
        self.journals.mark_delivered(group, ranks, self._applied)
        return UpdatesAnswer([encoded(u) for u in updates], self._applied, True, restored)

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.journals.releasing:
                self._release_polls()
            beats_due = self._beats.deadline()
            if beats_due is None:
                await self._has_input.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(beats_due):
                        await self._has_input.wait()
            batch = self._next_batch()
            if not self._queue:
                self._has_input.clear()
            if batch or (beats_due is not None and loop.time() >= beats_due):
                self._batch_idle.clear()
                try:
                    await self._process(batch)
                finally:
                    self._batch_idle.set()

    def _next_batch(self) -> list[_Input]:
        """Take queued inputs for one append, in arrival order.

        The fold pre-checks a whole batch against the state *before* it, so two inputs that
        could change each other's verdict must not share a batch. Such an input is deferred to
        the next batch, and so is every later input it must stay behind:

        - a ``join``, ``exit`` or ``death_reported`` changes what the fold accepts from its
          rank, so it shares no batch with any other input of that rank (a join of a new
          incarnation, then a heartbeat from the old one);
        - a second proposal with the same idempotency key waits for the first;
        - anything for a group waits for the batch that creates the group.

        Heartbeats, links and ACKs of one rank do not change each other's verdicts, so they
        share batches; that keeps barriers (an ACK per rank beside its heartbeats) from cutting
        the group commit into small pieces.
        """
        batch: list[_Input] = []
        deferred: list[_Input] = []
        keys: set[tuple[Any, ...]] = set()
        touched: set[tuple[str | None, int]] = set()
        changed: set[tuple[str | None, int]] = set()
        blocked: set[tuple[str | None, int]] = set()
        created: set[str | None] = set()
        blocked_groups: set[str | None] = set()
        queue = self._queue
        while queue and len(batch) < self._max_batch:
            item = queue.popleft()
            if item.abandoned:  # the caller went away before its turn
                continue
            rec = item.record
            rank = None if rec.rank is None else (rec.group, rec.rank)
            changes_rank = rec.kind in _RANK_CHANGING
            if (
                rec.group in created
                or rec.group in blocked_groups
                or (item.key is not None and item.key in keys)
                or (
                    rank is not None
                    and (rank in blocked or rank in changed or (changes_rank and rank in touched))
                )
            ):
                deferred.append(item)
                if rank is not None:
                    blocked.add(rank)
                if item.key is not None:
                    keys.add(item.key)
                if rec.kind == "group_created":
                    blocked_groups.add(rec.group)
                continue
            if item.key is not None:
                keys.add(item.key)
            if rank is not None:
                touched.add(rank)
                if changes_rank:
                    changed.add(rank)
            if rec.kind == "group_created":
                created.add(rec.group)
            batch.append(item)
        queue.extendleft(reversed(deferred))
        return batch

    def _precheck(self, item: _Input) -> Outcome | None:
        if item.precheck is not None and (outcome := item.precheck(self.machine)) is not None:
            return outcome
        rec = item.record
        if rec.kind == "tick":
            return None
        if (
            rec.kind in REPEATABLE
            and (earlier := self.machine.repeat_of(rec.kind, rec.group, rec.rank, rec.payload))
            is not None
        ):
            return Existing(earlier)
        refused = self.machine.check(rec.kind, rec.group, rec.rank, rec.payload)
        if refused is None:
            return None
        self.metrics.fenced[refused.code] += 1
        return Refusal(refused.code, refused.message)

    def _shared_beats(self, group: str, beats: dict[int, list[_Input]]) -> _Input | None:
        """One ``heartbeat`` record for the beats of ``group`` that waited together, each
        checked again against the state the record will be folded on (see
        ``coordinator.fold.heartbeats``); None when none of them is still current."""
        ranks: list[int] = []
        kept: list[_Input] = []
        for rank, items in beats.items():
            current = False
            for item in items:
                if item.abandoned:
                    continue
                if (outcome := self._precheck(item)) is not None:
                    item.answer(outcome)
                    continue
                kept.append(item)
                current = True
            if current:
                ranks.append(rank)
        if not ranks:
            return None
        record = NewRecord(
            kind="heartbeat", group=group, rank=None, payload={"ranks": rank_sets.encode(ranks)}
        )
        payload_bytes = validate(record)
        record = msgspec.structs.replace(record, payload=decode_payload(payload_bytes))
        self.metrics.heartbeats += len(kept)
        return _Input(record, payload_bytes, _Shared(kept), 0, None, None, kept[0].arrived)

    def _admit(self, batch: list[_Input], now: float) -> list[_Input]:
        """What of a batch goes into this append: each input pre-checked against the fold (a
        refused one is answered at once), beats set aside to share a record, and the shared
        records of the beats now due put in front (see ``coordinator.fold.heartbeats``). ``now`` is
        the loop's clock, the heartbeat buffer's. Pure decisions: no I/O, no await."""
        accepted: list[_Input] = []
        for item in batch:
            outcome = self._precheck(item)
            if outcome is not None:
                item.answer(outcome)
            elif item.record.kind == "heartbeat" and item.record.rank is not None:
                self._beats.add(item.record.group, item.record.rank, item, now)  # type: ignore[arg-type]
            else:
                accepted.append(item)
        # A tick flushes every waiting beat ahead of it: no rank times out while its beat waits.
        ticking = any(item.record.kind == "tick" for item in accepted)
        shared = [
            item
            for group, beats in self._beats.take(now, everything=ticking)
            if (item := self._shared_beats(group, beats)) is not None
        ]
        # Ahead of the batch (they were checked against the state before it), but never ahead
        # of the resumed tick, the first input of a term (see ``start``).
        first = accepted[0].record if accepted else None
        at = int(
            first is not None and first.kind == "tick" and first.payload.get("resumed") is True
        )
        accepted[at:at] = shared
        return accepted

    async def _process(self, batch: list[_Input]) -> None:
        accepted = self._admit(batch, asyncio.get_running_loop().time())
        if not accepted:
            return
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
            self._stop(HostUnavailable("not_leader", str(exc)), accepted)
            return
        except LogError as exc:
            log.error("append of %d records failed: %s", len(accepted), exc)
            for item in accepted:
                item.fail(HostUnavailable("log_unavailable", str(exc)))
            await self._recover()
            return
        expected = list(range(self.machine.offset + 1, self.machine.offset + 1 + len(accepted)))
        if offsets == expected:
            term = self.log.term
            records = [
                _record(off, ts, term, i.record, crc)
                for off, i, crc in zip(offsets, accepted, checksums, strict=True)
            ]
        else:  # somebody else appended too: fold exactly what the log holds
            records = await self._read_through(offsets[-1])
        try:
            refused = await self._apply(records)
        except Exception:
            for item in accepted:
                item.fail(self._unavailable or HostUnavailable("fold_failed", "the fold failed"))
            return
        now = asyncio.get_running_loop().time()
        appends = self.metrics.appends
        latency = self.metrics.fold_latency
        for item, offset in zip(accepted, offsets, strict=True):
            appends[item.record.kind] += 1
            latency.observe(now - item.arrived)
            fenced = refused.get(offset) if refused else None
            if fenced is None:
                item.answer(Appended(offset))
            else:
                item.answer(Refusal(fenced.code, fenced.message, offset))
        self.metrics.append_batches += 1
        self._maybe_snapshot()

    async def _apply(self, records: Sequence[Record]) -> dict[int, Refused]:
        """Step the fold over durable records and carry out their effects.

        Order matters: projection rows are written before long-polls wake and proposals are
        answered, so whoever hears of a view can also read it in ``/views/history``.
        """
        refused: dict[int, Refused] = {}
        resolved: list[Proposal] = []
        rows = self._unwritten
        for rec in records:
            try:
                effects = self.machine.step(rec)
            except Exception as exc:  # a bug in the fold: stop before the state diverges further
                log.exception("the fold failed at offset %d", rec.offset)
                self._stop(
                    HostUnavailable(
                        "fold_failed", f"the fold failed at offset {rec.offset}: {exc}"
                    ),
                    [],
                )
                raise
            for effect in effects:
                self._carry_out(effect, rows, refused, resolved)
        last = records[-1].offset if records else self._applied
        if rows:
            try:
                await self.log.write_projections(
                    list(rows.values()), consumer=CONSUMER, offset=last
                )
                self._projected = last
                rows.clear()
            except LogError as exc:  # kept in _unwritten and retried with the next batch
                log.error("writing %d projection rows failed: %s", len(rows), exc)
        self._applied = last
        self.journals.wake()
        for proposal in resolved:
            for future in self._proposal_waiters.pop(proposal.id, []):
                if not future.done():
                    future.set_result(proposal)
        self._changed.set()
        return refused

    def _carry_out(
        self,
        effect: Effect,
        rows: dict[tuple[str, str, int], ProjectionRow],
        refused: dict[int, Refused],
        resolved: list[Proposal],
    ) -> None:
        if effect.offset > self._projected:
            for row in rows_for(effect):
                rows[(row.kind, row.group, row.seq)] = row
        aux = self._aux
        if isinstance(effect, ViewPrepare):
            update = prepare_update(
                group=effect.group,
                version=effect.version,
                base=self._views.get(effect.group),
                active_ranks=effect.active_ranks,
                participants=effect.participants,
                ack_deadline_ts=effect.ack_deadline_ts,
                offset=effect.offset,
            )
            aux.in_flight[effect.group] = update
            self.journals.publish_group(effect.group, update)
        elif isinstance(effect, ViewCommitted):
            view = effect.view
            prepare = aux.in_flight.get(view.group)
            if prepare is not None and prepare["version"] <= view.version:
                del aux.in_flight[view.group]
            self.metrics.view_changes[view.group] += 1
            # what a rank receives is what changed since the version before (wire.protocol)
            update = view_update(self._views.get(view.group), view)
            self._views[view.group] = view
            self.journals.publish_group(view.group, update)
        elif isinstance(effect, RankState):
            update = rank_state_update(effect)
            aux.rank_states.setdefault(effect.group, {})[str(effect.rank)] = update
            self.journals.publish_rank(effect.group, effect.rank, update)
        elif isinstance(effect, ShutdownWithSave):
            update = shutdown_update(effect)
            aux.shutdown[effect.group] = update
            self.journals.publish_group(effect.group, update)
        elif isinstance(effect, ProposalResolved):
            self.metrics.proposals[effect.proposal.status] += 1
            resolved.append(effect.proposal)
        elif isinstance(effect, Refused):
            self.metrics.fenced[effect.code] += 1
            refused[effect.offset] = effect
        elif isinstance(effect, GroupCreated):
            size = int(effect.config.world_size)
            aux.world_sizes[effect.group] = size
            self.journals.set_world_size(effect.group, size)
        elif isinstance(effect, GroupFailed):
            aux.in_flight.pop(effect.group, None)

    def _release_polls(self) -> None:
        """Answer the long polls that published updates woke.

        A view change wakes every agent host's long poll of its group at once (twice: prepare,
        then commit), and each answer brings back an ACK request and the next poll. While other
        inputs are queued, that burst is spread over the next ``poll_spread`` batches, at least
        ``poll_release`` polls a batch, oldest first, so the heartbeats queued meanwhile are
        served between its parts instead of behind all of it; with nothing queued, every woken
        poll is answered at once (see ``_run``)."""
        if self._queue:
            self.journals.release_share(self._poll_release, self._poll_spread)
        else:
            self.journals.release()

    def _next_ts(self) -> int:
        """The writer clock for a batch, never behind the last record (a clock step back would
        otherwise move the fold's time backwards)."""
        self._last_ts = max(time.time_ns(), self._last_ts)
        return self._last_ts

    async def _read_through(self, until: int) -> list[Record]:
        out: list[Record] = []
        while self.machine.offset + len(out) < until:
            after = out[-1].offset if out else self.machine.offset
            page = await self.log.read(after=after, limit=1000, until=until)
            if not page:
                break
            out.extend(page)
        return out

    async def _catch_up(self) -> None:
        """Fold every record the log holds beyond the fold's offset (start, or after an error)."""
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
            await self._apply(page)
            self.journals.release()  # nothing waits behind these: answer every woken poll
        self._applied = self.machine.offset

    async def _recover(self) -> None:
        """After a failed append the batch may or may not be durable: read back what is."""
        try:
            await self._catch_up()
        except LogError as exc:
            log.error("cannot read the log back after a failed append: %s", exc)

    def _stop(self, why: HostUnavailable, inflight: list[_Input]) -> None:
        log.error("the host stops taking inputs: %s", why.detail)
        self._unavailable = why
        for item in inflight:
            item.fail(why)
        self._fail_queued(why)

    def _fail_queued(self, why: HostUnavailable) -> None:
        while self._queue:
            self._queue.popleft().fail(why)
        self._beats.drain(lambda beat: beat.fail(why))
        self.journals.wake_all()

    # -- time ------------------------------------------------------------------------------------

    async def _ticker(self) -> None:
        """Append a ``tick`` once the fold's next deadline has passed (the fold has no clock)."""
        last_tick_deadline: int | None = None
        while True:
            self._changed.clear()
            deadline = self.machine.next_deadline()
            now = time.time_ns()
            if deadline is not None and now > deadline:
                if deadline == last_tick_deadline:
                    # The tick did not move the deadline; do not spin, wait for the next change.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.1):
                            await self._changed.wait()
                    last_tick_deadline = None
                    continue
                last_tick_deadline = deadline
                try:
                    await self.submit(NewRecord(kind="tick", group=None, payload={}))
                except HostUnavailable:
                    return
                continue
            timeout = None if deadline is None else (deadline - now) / 1e9 + 0.0005
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    # -- snapshots -------------------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        """Start a snapshot when one is due and none is being written.

        The state is encoded here, between two batches, so it is exactly the fold at its
        offset; the write runs beside the next batches instead of holding them up (a snapshot
        grows with the group, and its commit would otherwise stall every input queued behind
        it). A restart therefore folds at most ``snapshot_every`` records plus
        what arrived while one snapshot was being written.
        """
        if self._snapshot_writing is not None and not self._snapshot_writing.done():
            return
        due = self.machine.offset - self._snapshot_offset >= self._snapshot_every or (
            self.machine.offset > self._snapshot_offset
            and time.monotonic() - self._snapshot_time >= self._snapshot_interval_s
        )
        if due and not self._unwritten:
            offset = self.machine.offset
            data = _encode_snapshot(self.machine, self._aux)
            self._snapshot_writing = asyncio.get_running_loop().create_task(
                self._save_snapshot(offset, data)
            )

    async def _snapshot(self) -> None:
        """Save the fold and the host's derived state at the fold's offset, and wait for it.

        Taken only when every projection row up to that offset is written, so a restart from it
        never misses a row.
        """
        if self._snapshot_writing is not None:
            await self._snapshot_writing
        offset = self.machine.offset
        if offset == self._snapshot_offset:
            return
        await self._save_snapshot(offset, _encode_snapshot(self.machine, self._aux), quiet=False)

    async def _save_snapshot(self, offset: int, data: bytes, *, quiet: bool = True) -> None:
        try:
            await self.log.save_snapshot(CONSUMER, offset, data)
        except LogError as exc:  # StaleTermError too: a deposed leader writes no snapshot
            if not quiet:
                raise
            # the next one retries; until then a restart folds a longer tail
            log.error("snapshot at offset %d failed: %s", offset, exc)
            return
        self._snapshot_offset = offset
        self._snapshot_time = time.monotonic()
        self.metrics.snapshots += 1


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


async def _restore_state(log_: Log) -> tuple[Coordinator, _Aux]:
    """The latest usable snapshot: the host's own, or the latest one compaction kept when that
    is newer (records may have been removed behind it, so an older start cannot be folded).
    With neither, a fold from scratch; on a compacted log that is impossible, so it fails."""
    candidates: list[tuple[int, str, bytes | None]] = []
    snap = await log_.load_snapshot(CONSUMER)
    if snap is not None:
        candidates.append((snap[0], "snapshot", snap[1]))
    kept = await log_.kept_snapshots(CONSUMER)
    if kept:
        candidates.append((kept[-1], "kept snapshot", None))
    for offset, what, data in sorted(candidates, key=lambda c: c[0], reverse=True):
        if data is None:
            data = await log_.load_kept_snapshot(CONSUMER, offset)
        try:
            return _decode_snapshot(data or b"")
        except Exception as exc:  # an older format, or a damaged blob: try the next one
            log.warning("%s at offset %d unusable (%s)", what, offset, exc)
    removed = await log_.removed_ranges()
    if removed:
        raise LogError(
            f"{log_.where} was compacted up to offset {removed[-1].last} and no snapshot "
            "behind which its records were removed can be read; it cannot be folded"
        )
    if candidates:
        log.warning("no usable snapshot; replaying the whole log")
    return Coordinator(), _Aux()


def _encode_snapshot(machine: Coordinator, aux: _Aux) -> bytes:
    return msgspec.json.encode(
        {
            "format": SNAPSHOT_FORMAT,
            "fold": machine.snapshot(),
            "host": msgspec.to_builtins(aux),
        }
    )


def _decode_snapshot(data: bytes) -> tuple[Coordinator, _Aux]:
    doc = msgspec.json.decode(data)
    if doc.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"snapshot format {doc.get('format')!r}, expected {SNAPSHOT_FORMAT}")
    return Coordinator.from_snapshot(doc["fold"]), msgspec.convert(doc["host"], _Aux)
