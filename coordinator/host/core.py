"""The host core: the one host that the service's loop and the simulator both drive.

As etcd's ``node.run`` and its tests drive one ``RawNode``, the asyncio loop (``loop.py``) and
the deterministic simulator (``sim/world.py``) drive one :class:`HostCore`: it holds the fold and
everything the host derives from it (its state, the update journals, the read model, the queue
and the admission of inputs) and makes every decision of a cycle, without I/O and without a
clock of its own. The driver brings the inputs and the time, appends, writes the rows and says
when each part is done; a cycle reads

.. code-block:: python

    accepted = core.admit(core.take(max_batch), now)  # pre-checked; beats share records
    records = ...                                      # the driver appends them (durable)
    ready = core.step(records, projected=...)          # the fold over them: one Ready
    core.publish_updates(ready)                        # into the journals, not yet visible
    ...                                                # the driver writes ready.rows
    core.carried_out(ready)                            # applied; read model published; wake
    core.answer(accepted, offsets, ready, now)         # each input its outcome

and a long poll is :meth:`updates_now` (None: the driver parks it until the journal wakes it).
What only one driver does stays with it: the service times the shutdown's checkpoint-rank lead
(``journal.py``'s hold), paces the answers of woken polls and writes snapshots to its log; the
simulator keeps its log in a list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from ...eventlog.record import Record
from ..fold.effects import Effect
from ..fold.heartbeats import HeartbeatBuffer
from ..fold.machine import Coordinator
from .batching import Admission, decisions_first, take_batch
from .decisions import say
from .inputs import Appended, Input, Refusal
from .journal import UpdateJournals
from .metrics import HostMetrics
from .polls import UpdatesAnswer, resync_answer
from .reads import Reads, ReadsPublisher
from .ready import HostState, Ready, ReadyBuilder, publish


class FoldFailed(Exception):
    """The fold raised while stepping the record at ``offset`` (a bug in the fold: the driver
    stops before the state diverges further)."""

    def __init__(self, offset: int, cause: BaseException) -> None:
        super().__init__(f"the fold failed at offset {offset}: {cause}")
        self.offset = offset
        self.cause = cause


class HostCore:
    """The fold and what the host derives from it; see the module docstring."""

    def __init__(
        self,
        machine: Coordinator,
        state: HostState,
        *,
        heartbeat_flush_s: float,
        metrics: HostMetrics | None = None,
        journals: UpdateJournals | None = None,
    ) -> None:
        self.machine = machine
        #: the host's own derived state (in the snapshot)
        self.state = state
        self.metrics = metrics if metrics is not None else HostMetrics()
        self.journals = journals if journals is not None else UpdateJournals(floor=machine.offset)
        for group, size in state.world_sizes.items():
            self.journals.set_world_size(group, size)
        self.ready_builder = ReadyBuilder.for_machine(machine, state)
        #: what the API reads of the fold (``reads.py``), published once per cycle
        self.published = ReadsPublisher(machine)
        #: the inputs waiting for a cycle, in arrival order
        self.queue: deque[Input] = deque()
        self.admission = Admission(
            machine, HeartbeatBuffer(heartbeat_flush_s), self.metrics, reads=self._reads
        )
        #: the offset up to which every effect is carried out
        self.applied = machine.offset

    def _reads(self) -> Reads:
        return self.published.current

    @property
    def reads(self) -> Reads:
        """The read model of the last cycle carried out."""
        return self.published.current

    # -- a cycle ---------------------------------------------------------------------------------

    def take(self, max_batch: int) -> list[Input]:
        """The next batch of queued inputs (``batching.take_batch`` says what may share one)."""
        return take_batch(self.queue, max_batch)

    def admit(self, batch: list[Input], now: float) -> list[Input]:
        """What of ``batch`` is appended, at ``now`` (the driver's clock, in seconds): refused
        inputs answered, beats buffered, the due beats' shared records in front."""
        return self.admission.admit(batch, now)

    def step(
        self,
        records: Sequence[Record],
        *,
        projected: int,
        live: bool = False,
        observe: Callable[[Record, list[Effect]], None] | None = None,
    ) -> Ready:
        """Step the fold over durable records, in offset order: their effects as one Ready
        (``projected``: the consumer offset of the rows written so far). ``live``: inputs
        decided now, whose decisions are logged (not a catch-up's); ``observe`` hears of each
        record and its effects. Raises :class:`FoldFailed` if the fold raises."""
        effects: list[Effect] = []
        step = self.machine.step
        for rec in records:
            try:
                stepped = step(rec)
            except Exception as exc:
                raise FoldFailed(rec.offset, exc) from exc
            if observe is not None:
                observe(rec, stepped)
            effects.extend(stepped)
        last = records[-1].offset if records else self.applied
        if live:
            say(effects)
        return self.ready_builder.ready(last, effects, projected=projected)

    def publish_updates(self, ready: Ready) -> None:
        """Put the Ready's agent updates in the journals (readers see them at
        :meth:`carried_out`), and count what it decided."""
        metrics = self.metrics
        for group in ready.committed:
            metrics.view_changes[group] += 1
        for proposal in ready.resolved:
            metrics.proposals[proposal.status] += 1
        for refused in ready.refused.values():
            metrics.fenced[refused.code] += 1
        publish(self.journals, ready)

    def carried_out(self, ready: Ready) -> None:
        """The driver carried out ``ready`` (its rows written): every effect up to its offset
        is applied, the read model is published, and the readers of the journals wake."""
        self.applied = ready.offset
        self.published.publish()
        self.journals.wake()

    def answer(self, accepted: list[Input], offsets: list[int], ready: Ready, now: float) -> None:
        """Each input its outcome: appended, or fenced while stepping; the decisions before
        the shared heartbeat records (``batching.decisions_first``)."""
        appends = self.metrics.appends
        latency = self.metrics.fold_latency
        refused = ready.refused
        if len(offsets) != len(accepted):
            raise ValueError(f"{len(accepted)} inputs appended at {len(offsets)} offsets")
        for at in decisions_first(accepted):
            item, offset = accepted[at], offsets[at]
            appends[item.record.kind] += 1
            latency.observe(now - item.arrived)
            fenced = refused.get(offset) if refused else None
            if fenced is None:
                item.answer(Appended(offset))
            else:
                item.answer(Refusal(fenced.code, fenced.message, offset))
        self.metrics.append_batches += 1

    # -- long polls ------------------------------------------------------------------------------

    def updates_now(
        self, group: str, ranks: Sequence[int], after: int, *, view: int | None = None
    ) -> UpdatesAnswer | None:
        """What concerns ``ranks`` of ``group`` after ``after`` as it stands: the updates, a
        resync, or None when nothing is there yet (the reader then waits on
        ``journals.waiter(group)``). A reader past the applied offset has seen offsets this
        log never reached (the log was restored from an older copy): it resyncs afresh."""
        if after > self.applied:
            return self.resync(group, ranks, None, restored=True)
        journals = self.journals
        got = journals.entries_since(group, ranks, after)
        if got is None:
            return self.resync(group, ranks, view)
        if got:
            next_after = got[-1][0]
            journals.mark_delivered(group, ranks, next_after)
            return UpdatesAnswer([raw for _, raw in got], next_after, False)
        return None

    def resync(
        self, group: str, ranks: Sequence[int], view: int | None, *, restored: bool = False
    ) -> UpdatesAnswer:
        """The current state instead of what the journal no longer holds."""
        self.metrics.resyncs += 1
        return resync_answer(
            self.machine,
            self.state,
            self.journals,
            group,
            ranks,
            view,
            applied=self.applied,
            restored=restored,
        )
