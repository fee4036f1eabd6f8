"""A deterministic simulator of the whole system: one group's coordinator, its agents, the network,
crashes and the clock, in one process, from a seed.

Everything random comes from ``random.Random`` seeded by the seed; time is simulated
nanoseconds on an event queue (no threads, no asyncio, no clock), so a seed replays exactly.

**What is real.** The fold is the real :class:`coordinator.fold.machine.Coordinator`; each rank is a
real :class:`agent.machine.AgentMachine`. The coordinator's host is the service's own host core,
:class:`coordinator.host.core.HostCore`, which the asyncio loop (``coordinator.host.loop``)
drives too, as etcd's ``node.run`` and its tests drive one ``RawNode``: its queue and batching
rule, the admission of a batch (the pre-check of each input, the heartbeat buffer and its
re-check of each beat before its shared record is appended), the step of the fold into one
Ready value (projection rows, agent updates), the update journals (what each rank may read,
and when it must resync), the read model published after each cycle, the answers (decisions
before shared heartbeat records) and a long poll's answer (``updates_now``: updates, a resync,
or nothing yet). The snapshot format is the real one (``coordinator.host.snapshots``).

**What is simulated, and how it differs.** :class:`SimHost` is the driver, in place of the
asyncio loop, on simulated time: it appends to a list (the log survives every crash; a crash may
fall between the append and the answers), writes projection rows into a dict with their
consumer offset, snapshots every ``snapshot_every`` records, and parks long polls until the
core's journals have something for them. The ticker appends a ``tick`` once the coordinator's
clock passes ``next_deadline()``, with the real one's rule against spinning on a deadline a tick
did not move. Left out: the long-poll pacing of a burst (``release_share``: every woken poll is
answered at once) and the checkpoint rank's lead on a shutdown (``journal.py``'s hold). The HTTP
layer is a message per request: events become records as ``POST /agents/events`` makes them,
proposals carry their idempotency key (the host answers a repeat with its proposal), death
reports are ``POST /agents/deaths``. The data plane is simulated: it is ready a little after the
store is known, and after a view is installed (or the network changes) it reports as down
exactly the peers it cannot reach.

**Faults**, drawn up front from the seed as a schedule (so a failing run shrinks by dropping
them): partitions that cut an arbitrary set of nodes (ranks and the coordinator) from the rest;
coordinator crashes (down for a while, restored from the last snapshot plus the log's tail,
sometimes between the append and the answers); agent kills, with or without a supervisor's
death report racing the dead process's last heartbeats, and with or without a replacement (a
new incarnation); pauses (a process that stops and resumes, as SIGSTOP does); in-place rejoins;
clean exits (sometimes followed by a replacement); steps of the coordinator's clock (backwards
any amount, forwards at most a second: what the heartbeat deadline's margin tolerates); and
proposals, activate or deactivate, with idempotency keys, sent more than once. Throughout, the
network loses, duplicates, delays and so reorders messages, at rates drawn per seed.

**Facets.** A facet that brings work of its own to a run declares its part of the simulator
(its plugin's ``sim``, ``coordinator/fold/registry.py``): a module with ``draw(seed, ranks,
horizon)``, what a seed draws for it (from a stream of its own, so the other faults of a seed
do not depend on it) and the faults it adds to the schedule, and ``Sim(world, drawn)``, the
facet in one world: ``start()`` schedules its operator's actions when the run starts,
``worker(process)`` makes its part of each new process (given the facet updates its agent
hands on, ``on_update``, and the answers to its reports, ``on_answer``), and ``check(coord,
status)`` checks its invariants against the fold after every step that changed the log. The
epochs facet's (``facets/epochs/sim.py``) reads one epoch in most seeds, each rank as
``agent.data``'s sampler does, and checks that every position the fold counts for a rank was
read by it. The simulator names no facet: it runs the parts of the facets its fold is built
with, in their order.

The invariants (``sim/invariants.py``, and those of the facets' parts) are checked after every
step.
"""

from __future__ import annotations

import heapq
import random
from typing import Any, NamedTuple

import msgspec

from ..agent.driver import Driver
from ..agent.machine import (
    BEATS,
    EVENTS,
    AgentConfig,
    AgentMachine,
    Close,
    ConnectDataPlane,
    DataPlaneReady,
    EventAnswered,
    EventsAnswered,
    EventsFailed,
    FacetUpdate,
    InstallView,
    LinkEvidence,
    MoveDataPlane,
    PollFailed,
    PollUpdates,
    Rejoin,
    SendEvents,
    ShutdownWithSave,
    Start,
    Stopped,
    StoreAddress,
    Tick,
    UpdatesReceived,
)
from ..coordinator.fold import registry
from ..coordinator.fold.machine import Coordinator
from ..coordinator.fold.projections import rows_for
from ..coordinator.host.batching import MAX_BATCH
from ..coordinator.host.core import HostCore
from ..coordinator.host.inputs import Input, queue_submission
from ..coordinator.host.journal import UpdateJournals, decoded
from ..coordinator.host.loop import Appended, Existing, Refusal, UpdatesAnswer
from ..coordinator.host.ready import HostState, Ready
from ..coordinator.host.snapshots import decode_snapshot, encode_snapshot
from ..coordinator.host.ticks import TickNow, next_step
from ..eventlog.record import NewRecord, Record
from ..wire.protocol import event_payload
from .invariants import Invariants, Violation

S = 1_000_000_000
MS = 1_000_000
#: The coordinator's wall clock at simulated time zero.
T0 = 1_764_000_000 * S
GROUP = "g"
COORD, SUPERVISOR, OPERATOR = "coord", "supervisor", "operator"
#: How long a long poll waits at the coordinator, and how long a client waits for an answer.
POLL_WAIT_NS = 10 * S
EVENTS_TIMEOUT_NS = 2 * S
POLL_TIMEOUT_NS = POLL_WAIT_NS + 2 * S
#: How long after its current view committed a quiet cluster must have converged on it: a lost
#: long poll is noticed at POLL_TIMEOUT_NS, and retried after at most the agent's backoff.
SETTLE_NS = 25 * S
_OUTSIDE = (SUPERVISOR, OPERATOR)
#: What a timer returns when it found nothing to do: it does not count as a step.
STALE = object()


class Fault(NamedTuple):
    """One scheduled fault: at simulated time ``t`` (ns), ``kind`` with ``args``."""

    t: int
    kind: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.t / S:9.3f}s {self.kind}{self.args}"


class Setup(NamedTuple):
    """Everything a seed decides before the run starts."""

    ranks: int
    config: dict[str, Any]
    heartbeat_s: float
    flush_s: float
    snapshot_every: int
    loss: float
    dup: float
    slow: float
    #: (group, rank) byte bounds of the update journals, small enough to make readers resync
    journal_bytes: tuple[int, int] | None
    faults: tuple[Fault, ...]
    #: what the seed drew for each facet's part of the simulator (:func:`sim_parts`), in order
    facets: tuple[Any, ...] = ()


#: The run length the fault schedule is drawn for; ``--steps`` only cuts a run short, so a
#: shorter reproduction keeps the same schedule.
HORIZON_STEPS = 600
#: The most faults a seed's schedule holds.
MAX_FAULTS = 10


def setup(seed: int) -> Setup:
    """The seed's cluster, its network and its fault schedule (a pure function of the seed)."""
    rng = random.Random(seed)
    n = rng.randint(4, 8)
    hb = rng.choice((0.5, 1.0))
    max_failure = rng.choice((None, None, rng.randint(2, n), "50%"))
    config: dict[str, Any] = {
        "heartbeat_timeout_s": hb * rng.choice((4, 6, 10)),
        "ack_timeout_s": rng.choice((2.0, 4.0, 8.0)),
        "admission_timeout_s": rng.choice((2.0, 5.0, 20.0)),
        "formation_timeout_s": rng.choice((10.0, 30.0, 60.0)),
        "reconcile_window_s": rng.choice((0.0, 0.1, 0.25)),
        "min_ranks": rng.choice((n, n, rng.randint(1, n))),
        "min_active": rng.choice((1, 1, 2)),
        "max_failure": max_failure,
        "auto_deactivate_on_failure": rng.random() < 0.8,
    }
    # roughly how much simulated time the run covers: each rank makes a few steps a beat
    horizon = HORIZON_STEPS / (n * 5 / hb)
    faults: list[Fault] = []
    nodes = [COORD, *range(n)]
    for _ in range(rng.randint(0, MAX_FAULTS)):
        t = round(rng.uniform(0.3, horizon) * S)
        kind = rng.choices(
            (
                "partition",
                "crash",
                "kill",
                "zombie",
                "pause",
                "rejoin",
                "close",
                "clock",
                "propose",
            ),
            (3, 2, 3, 1, 1, 1, 1, 1, 3),
        )[0]
        if kind == "partition":
            side = tuple(sorted(rng.sample(nodes, rng.randint(1, len(nodes) - 1)), key=str))
            args: tuple[Any, ...] = (side, round(rng.uniform(0.1, 8.0) * S))
        elif kind == "crash":
            args = (round(rng.uniform(0.01, 5.0) * S), rng.random() < 0.5)
        elif kind == "kill":
            report = round(rng.uniform(0.0, 3.0) * S) if rng.random() < 0.6 else None
            replace = round(rng.uniform(0.1, 6.0) * S) if rng.random() < 0.7 else None
            args = (rng.randrange(n), report, replace)
        elif kind == "zombie":
            pause = round(rng.uniform(1.0, 8.0) * S)
            report = round(rng.uniform(0.0, 1.0) * S) if rng.random() < 0.7 else None
            args = (rng.randrange(n), pause, report, round(rng.uniform(0.1, 3.0) * S))
        elif kind == "pause":
            args = (rng.randrange(n), round(rng.uniform(0.3, 8.0) * S))
        elif kind == "rejoin":
            args = (rng.randrange(n),)
        elif kind == "close":
            replace = round(rng.uniform(0.2, 5.0) * S) if rng.random() < 0.6 else None
            args = (rng.randrange(n), replace)
        elif kind == "clock":
            args = (round(rng.uniform(-20.0, 1.0) * S),)
        else:
            op = rng.choice(("activate", "activate", "deactivate"))
            ranks = tuple(sorted(rng.sample(range(n), rng.randint(1, 2))))
            key = rng.choice((None, "k0", "k1", "k2"))
            args = (op, ranks, key, rng.randint(1, 3))
        faults.append(Fault(t, kind, args))
    drawn = []
    for _, part in sim_parts():
        facet, more = part.draw(seed, n, horizon)
        drawn.append(facet)
        faults.extend(more)
    faults.sort()
    return Setup(
        facets=tuple(drawn),
        ranks=n,
        config=config,
        heartbeat_s=hb,
        flush_s=rng.choice((0.0, 0.05, 0.2)),
        snapshot_every=rng.choice((3, 10, 40)),
        loss=rng.choice((0.0, 0.005, 0.02, 0.05)),
        dup=rng.choice((0.0, 0.02, 0.1)),
        slow=rng.choice((0.0, 0.01, 0.05)),
        journal_bytes=rng.choice((None, None, (1500, 300), (6000, 1000))),
        faults=tuple(faults),
    )


def sim_parts() -> tuple[tuple[str, Any], ...]:
    """The parts of the simulator the facets of the fold declare (their plugins' ``sim``), by
    facet name, in the facets' order (the module docstring says what a part is)."""
    return tuple(
        (plugin.name, part)
        for plugin in registry.plugins()
        if (part := registry.part(plugin, "sim")) is not None
    )


# -- the coordinator --------------------------------------------------------------------------


class _Request:
    """A client's request being answered: one outcome per input (the host's ``_Reply``)."""

    __slots__ = ("world", "src", "rid", "records", "results", "remaining", "dead", "lane")

    def __init__(
        self, world: World, src: Any, rid: int, records: list[NewRecord], lane: str
    ) -> None:
        self.world, self.src, self.rid, self.lane = world, src, rid, lane
        self.records = records
        self.results: list[Any] = [None] * len(records)
        self.remaining = len(records)
        self.dead = False

    def set(self, index: int, outcome: Any) -> None:
        if self.dead or self.results[index] is not None:
            return
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining == 0:
            self.world.answer(self)

    def set_many(self, indices: list[int], outcome: Any) -> None:
        for index in indices:
            self.set(index, outcome)

    def fail(self, exc: BaseException) -> None:
        self.dead = True

    def done(self) -> bool:
        return self.dead or self.remaining == 0


class SimHost:
    """One life of the coordinator: the service's host core (``HostCore``), driven
    synchronously on simulated time."""

    def __init__(self, world: World, epoch: int) -> None:
        self.world = world
        self.epoch = epoch
        if world.snapshot is not None:
            machine, aux = decode_snapshot(world.snapshot)
        else:
            machine, aux = Coordinator(), HostState()
        self.machine = machine
        journals = None
        if world.setup.journal_bytes is not None:
            group_bytes, rank_bytes = world.setup.journal_bytes
            journals = UpdateJournals(
                floor=machine.offset, group_limit_bytes=group_bytes, rank_limit_bytes=rank_bytes
            )
        self.core = HostCore(machine, aux, heartbeat_flush_s=world.setup.flush_s, journals=journals)
        self.snapshot_offset = machine.offset
        self.store = StoreAddress(COORD, 29_500 + epoch)
        self.parked: dict[int, tuple[Process, int, int, int | None, int]] = {}
        self.last_ts = 0
        self.last_tick_deadline: int | None = None
        self.process_at: int | None = None
        self.ticker_gen = 0
        self.crash_after_append = False
        # catch_up: fold every record the log holds beyond the snapshot
        tail = world.log[machine.offset :]
        if tail:
            self.last_ts = max(self.last_ts, tail[-1].ts)
            self._apply(tail)
        # start(): the resumed tick first, when a deadline waits on the ranks
        if machine.waits_on_ranks():
            self.submit([NewRecord(kind="tick", group=None, payload={"resumed": True})], None, None)
        self.ticker()

    # -- inputs ----------------------------------------------------------------------------------

    def submit(
        self,
        records: list[NewRecord],
        req: _Request | None,
        key: tuple[Any, ...] | None,
        precheck: Any = None,
    ) -> None:
        """``Host._enqueue``: validate on arrival, queue for the loop (the host's own
        ``queue_submission``: a run of heartbeats is one input)."""
        if req is None:
            req = _Request(self.world, None, 0, records, EVENTS)
        queue_submission(
            self.core.queue, records, req, key, precheck, self.world.now / S, normalized=False
        )
        self.wake(self.world.now + MS)

    def wake(self, at: int) -> None:
        if self.process_at is None or at < self.process_at:
            self.process_at = at
            self.world.at(at, self.loop, self.epoch)

    def loop(self, epoch: int) -> Any:
        """One turn of ``Host._run``: take a batch, process it, come back while inputs wait."""
        if self.world.coord is not self or epoch != self.epoch:
            return STALE
        now = self.world.now
        if self.process_at is not None and now < self.process_at:
            return STALE
        self.process_at = None
        core = self.core
        batch = core.take(MAX_BATCH)
        beats_due = core.admission.beats.deadline()
        if batch or (beats_due is not None and now / S >= beats_due):
            self.process(batch)
        if self.world.coord is not self:
            return
        if core.queue:
            self.wake(now + MS)
        beats_due = core.admission.beats.deadline()
        if beats_due is not None:
            self.wake(max(now + 1, round(beats_due * S)))
        self.ticker()

    def process(self, batch: list[Input]) -> None:
        """``Host._cycle`` on the core: admit, append (to a list: the log survives every
        crash), step and carry out, answer; a snapshot every ``snapshot_every`` records."""
        core = self.core
        accepted = core.admit(batch, self.world.now / S)
        if not accepted:
            return
        self.last_ts = max(self.world.wall(), self.last_ts)  # Host._next_ts
        log = self.world.log
        records = [
            Record(
                len(log) + 1 + i,
                self.last_ts,
                self.epoch,
                it.record.kind,
                it.record.group,
                it.record.rank,
                it.record.payload,
                0,
            )
            for i, it in enumerate(accepted)
        ]
        log.extend(records)  # durable
        self.world.appended()
        if self.crash_after_append:
            self.world.crash_now()
            return
        ready = self._apply(records)
        core.answer(accepted, [rec.offset for rec in records], ready, self.world.now / S)
        if self.machine.offset - self.snapshot_offset >= self.world.setup.snapshot_every:
            self.world.snapshot = encode_snapshot(self.machine, core.state)
            self.snapshot_offset = self.machine.offset

    def _apply(self, records: list[Record]) -> Ready:
        """``Host._step`` and ``Host._carry_out`` on the core: step (each record checked by the
        invariants), publish the updates, write the projection rows with their consumer
        offset, carried out (the read model published, the journals' readers woken)."""
        core = self.core
        world = self.world
        ready = core.step(records, projected=world.projected, observe=world.inv.on_record)
        core.publish_updates(ready)
        if ready.rows:
            for row in ready.rows.values():
                world.projections[(row.kind, row.group, row.seq)] = row.doc
            world.projected = ready.offset
        core.carried_out(ready)
        for rid in list(self.parked):
            self.poll_again(rid)
        return ready

    # -- the ticker --------------------------------------------------------------------------------

    def ticker(self, gen: int | None = None) -> Any:
        """``coordinator.host.ticks``' rule (``next_step``): a tick once the clock passes the
        fold's next deadline, never twice in a row for a deadline a tick did not move."""
        if gen is not None and (gen != self.ticker_gen or self.world.coord is not self):
            return STALE
        self.ticker_gen += 1
        step = next_step(self.machine.next_deadline(), self.world.wall(), self.last_tick_deadline)
        if isinstance(step, TickNow):
            self.last_tick_deadline = step.deadline
            self.submit([NewRecord(kind="tick", group=None, payload={})], None, None)
            return
        if step.forget:
            self.last_tick_deadline = None
        if step.timeout is not None:
            self.world.at(self.world.now + round(step.timeout * S), self.ticker, self.ticker_gen)

    # -- long polls --------------------------------------------------------------------------------

    def poll(self, src: Process, rid: int, after: int, view: int | None) -> None:
        """``Host.updates`` for one rank: at once if there is anything, else parked."""
        if after > self.core.applied:  # the log was restored from an older copy: resync at once
            self.world.resyncs += 1
            self.answer_poll(src, rid, self.core.updates_now(GROUP, (src.rank,), after, view=view))  # type: ignore[arg-type]
            return
        self.parked[rid] = (src, rid, after, view, self.world.now + POLL_WAIT_NS)
        self.world.at(self.world.now + POLL_WAIT_NS, self.poll_expired, rid)
        self.poll_again(rid)

    def poll_again(self, rid: int) -> None:
        """``HostCore.updates_now`` for a parked poll: answered once there is anything."""
        src, _, after, view, _ = self.parked[rid]
        ans = self.core.updates_now(GROUP, (src.rank,), after, view=view)
        if ans is not None:
            del self.parked[rid]
            if ans.resync:
                self.world.resyncs += 1
            self.answer_poll(src, rid, ans)

    def poll_expired(self, rid: int) -> Any:
        if self.world.coord is not self or rid not in self.parked:
            return STALE
        src, _, after, _, _ = self.parked.pop(rid)
        self.answer_poll(src, rid, UpdatesAnswer([], max(after, self.core.applied), False))

    def answer_poll(self, src: Process, rid: int, ans: UpdatesAnswer) -> None:
        updates = tuple(decoded(raw) for raw in ans.encoded)
        msg = ("updates", rid, updates, ans.next_after, self.store, ans.resync, ans.restored)
        self.world.send(COORD, src, msg)


# -- the agents -------------------------------------------------------------------------------


class Process(Driver):
    """One agent process: a real ``AgentMachine`` in the driver the real agent runs
    (``agent.driver``), and what its host and data plane do with each action."""

    def __init__(self, world: World, rank: int, incarnation: str) -> None:
        self.world = world
        self.rank = rank
        self.incarnation = incarnation
        hb = world.setup.heartbeat_s
        super().__init__(
            AgentMachine(
                AgentConfig(
                    group=GROUP,
                    rank=rank,
                    incarnation=incarnation,
                    world_size=world.setup.ranks,
                    heartbeat_interval_s=hb,
                )
            )
        )
        self.alive = True  # False once killed or stopped
        self.paused_until = 0
        self.clock = world.rng.uniform(0, 1000.0)  # a monotonic clock of its own (seconds)
        self.lanes: dict[str, int | None] = {EVENTS: None, BEATS: None}
        self.poll_rid: int | None = None
        self.tick_gen = 0
        self.store_gen = 0
        self.view = None
        #: each facet's part of this process (its part of the simulator's ``worker``), by name
        self.facets: dict[str, Any] = {name: sim.worker(self) for name, sim in world.facet_sims}

    def now(self) -> float:
        return self.world.now / S + self.clock

    @property
    def running(self) -> bool:
        return self.alive and self.world.now >= self.paused_until

    def feed(self, event: Any) -> None:  # type: ignore[override]
        if not self.running:
            return
        super().feed(event)
        self.schedule_tick()

    def schedule_tick(self) -> None:
        deadline = self.machine.next_deadline()
        if deadline is None or not self.alive:
            return
        self.tick_gen += 1
        at = max(self.world.now + 1, round((deadline - self.clock) * S) + 1)
        self.world.at(at, self.tick, self.tick_gen)

    def tick(self, gen: int) -> Any:
        if gen == self.tick_gen and self.running:
            self.feed(Tick(self.now()))
            return None
        return STALE

    # -- what the host and the data plane do with each action (``agent.driver.Driver``) ---------

    def send_events(self, action: SendEvents) -> None:
        w = self.world
        rid = w.rid()
        self.lanes[action.lane] = rid
        w.send(self, COORD, ("events", rid, action.events, action.lane))
        w.at(w.now + EVENTS_TIMEOUT_NS, self.events_timeout, action.lane, rid)

    def poll_updates(self, action: PollUpdates) -> None:
        w = self.world
        rid = w.rid()
        self.poll_rid = rid
        at = w.now + round(action.delay_s * S)
        w.at(at, self.send_poll, rid, action.after, action.view)

    def connect_data_plane(self, action: ConnectDataPlane | MoveDataPlane) -> None:
        w = self.world
        self.store_gen += 1
        w.at(w.now + w.rng.randrange(10 * MS, 300 * MS), self.data_plane_ready, self.store_gen)

    move_data_plane = connect_data_plane

    def install_view(self, action: InstallView) -> None:
        self.view = action.view
        self.world.inv.check_agent_view_in_history(GROUP, self.rank, self.incarnation, action.view)
        self.probe_later()

    def shutdown_with_save(self, action: ShutdownWithSave) -> None:
        w = self.world
        w.inv.check_agent_shutdown(self.rank, self.incarnation)
        w.at(w.now + w.rng.randrange(50 * MS, 1000 * MS), self.close)

    def stopped(self, action: Stopped) -> None:
        self.alive = False
        self.world.stopped.append((self.rank, self.incarnation, action.reason))

    def facet_update(self, action: FacetUpdate) -> None:
        for part in self.facets.values():
            part.on_update(action.update)

    def event_answered(self, action: EventAnswered) -> None:
        for part in self.facets.values():
            part.on_answer(action)

    def send_poll(self, rid: int, after: int, view: int | None) -> Any:
        if self.poll_rid != rid or not self.alive:
            return STALE
        if not self.running:  # paused: the poll goes out when it resumes
            self.world.at(self.paused_until, self.send_poll, rid, after, view)
            return
        self.world.send(self, COORD, ("poll", rid, after, view))
        self.world.at(self.world.now + POLL_TIMEOUT_NS, self.poll_timeout, rid)

    def events_timeout(self, lane: str, rid: int) -> Any:
        if self.lanes[lane] == rid and self.running:
            self.lanes[lane] = None
            self.feed(EventsFailed(self.now(), "timed out", lane))
        elif self.lanes[lane] == rid and self.alive:
            self.world.at(self.paused_until, self.events_timeout, lane, rid)
        else:
            return STALE
        return None

    def poll_timeout(self, rid: int) -> Any:
        if self.poll_rid == rid and self.running:
            self.poll_rid = None
            self.feed(PollFailed(self.now(), "timed out"))
        elif self.poll_rid == rid and self.alive:
            self.world.at(self.paused_until, self.poll_timeout, rid)
        else:
            return STALE
        return None

    def receive(self, msg: tuple[Any, ...]) -> None:
        if not self.running:
            return  # a paused or dead process reads nothing (its connection drops it)
        if msg[0] == "answer":
            _, rid, lane, results = msg
            if self.lanes[lane] != rid:
                return  # a duplicate, or an answer after the client gave up
            self.lanes[lane] = None
            self.feed(EventsAnswered(self.now(), results, lane))
        elif msg[0] == "updates":
            _, rid, updates, next_after, store, resync, restored = msg
            if self.poll_rid != rid:
                return
            self.poll_rid = None
            self.feed(UpdatesReceived(self.now(), updates, next_after, store, resync, restored))

    def data_plane_ready(self, gen: int) -> Any:
        if gen == self.store_gen and self.running:
            self.feed(DataPlaneReady(self.now()))
        elif gen == self.store_gen and self.alive:
            self.world.at(self.paused_until, self.data_plane_ready, gen)
        else:
            return STALE
        return None

    def probe_later(self) -> None:
        """The data plane checks its links a little later (after a view, or a change)."""
        w = self.world
        w.at(w.now + w.rng.randrange(5 * MS, 200 * MS), self.probe)

    def probe(self) -> Any:
        view = self.view
        if view is None or not self.running or not view.is_active(self.rank):
            return STALE
        peers = {
            p: ("up" if self.world.reachable(self.rank, p) else "down")
            for p in view.active_ranks
            if p != self.rank
        }
        self.feed(LinkEvidence(self.now(), view.version, peers))

    def close(self) -> None:
        self.feed(Close(self.now()))


# -- the world --------------------------------------------------------------------------------


class World:
    """The cluster, the network and the schedule; :meth:`run` steps it and checks every step."""

    def __init__(self, seed: int, steps: int, keep: set[int] | None = None) -> None:
        self.seed = seed
        self.steps = steps
        self.setup = setup(seed)
        faults = self.setup.faults
        self.faults = [f for i, f in enumerate(faults) if keep is None or i in keep]
        self.rng = random.Random(f"net-{seed}")
        self.now = 0
        self.step = 0
        self._queue: list[tuple[int, int, Any, tuple[Any, ...]]] = []
        self._seq = 0
        self._rid = 0
        self.log: list[Record] = []
        self.snapshot: bytes | None = None
        self.projections: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.projected = 0
        self.clock_offset = 0
        self.inv = Invariants()
        self.answered: list[tuple[int, str, str | None, Any, Any]] = []
        self.all_answered: list[tuple[int, str, str | None, Any, Any]] = []
        self.coord: SimHost | None = None
        self.coord_epoch = 0
        self.procs: dict[int, Process] = {}
        self.zombies: list[Process] = []
        self.resyncs = 0
        self.settled = False  # the convergence check ran
        self.incarnations = 0
        self.cuts: list[frozenset[Any]] = []
        self.stopped: list[tuple[int, str, str]] = []
        self.create_rid: int | None = None
        self.changed = False
        #: each facet's part of the simulator in this world (:func:`sim_parts`), by name
        self.facet_sims: tuple[tuple[str, Any], ...] = tuple(
            (name, part.Sim(self, drawn))
            for (name, part), drawn in zip(sim_parts(), self.setup.facets, strict=True)
        )

    # -- the event queue -------------------------------------------------------------------------

    def at(self, t: int, fn: Any, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t, self._seq, fn, args))

    def rid(self) -> int:
        self._rid += 1
        return self._rid

    def wall(self) -> int:
        """The coordinator's wall clock (it may step; the host never lets ``ts`` go back)."""
        return T0 + self.now + self.clock_offset

    # -- the network -----------------------------------------------------------------------------

    def cut(self, a: Any, b: Any) -> bool:
        """Whether a partition separates ``a`` from ``b``. Cuts run between the ranks and the
        coordinator; the operator and the supervisor reach the coordinator's address always."""
        if a in _OUTSIDE or b in _OUTSIDE:
            return False
        a = a.rank if isinstance(a, Process) else a
        b = b.rank if isinstance(b, Process) else b
        return any((a in side) != (b in side) for side in self.cuts)

    def reachable(self, a: int, b: int) -> bool:
        """Whether rank ``a``'s data plane reaches rank ``b``'s (a live, running process)."""
        proc = self.procs.get(b)
        return proc is not None and proc.running and not self.cut(a, b)

    def send(self, src: Any, dst: Any, msg: tuple[Any, ...]) -> None:
        rng = self.rng
        copies = 2 if rng.random() < self.setup.dup else 1
        for _ in range(copies):
            if self.cut(src, dst) or rng.random() < self.setup.loss:
                continue
            delay = rng.randrange(200_000, 3 * MS) + int(rng.expovariate(1 / (2 * MS)))
            if rng.random() < self.setup.slow:
                delay += rng.randrange(50 * MS, 1500 * MS)
            self.at(self.now + delay, self.deliver, src, dst, msg)

    def deliver(self, src: Any, dst: Any, msg: tuple[Any, ...]) -> None:
        if self.cut(src, dst):
            return
        if dst == COORD:
            if self.coord is not None:
                self.at_coordinator(src, msg)
        elif isinstance(dst, Process):
            dst.receive(msg)
        elif dst == OPERATOR and msg[1] == self.create_rid:
            self.create_rid = None

    def at_coordinator(self, src: Any, msg: tuple[Any, ...]) -> None:
        """The HTTP surface: a request becomes inputs of the host."""
        coord = self.coord
        assert coord is not None
        kind = msg[0]
        if kind == "poll":
            _, rid, after, view = msg
            coord.poll(src, rid, after, view)
        elif kind == "events":
            _, rid, events, lane = msg
            records = [
                NewRecord(
                    kind=ev.__struct_config__.tag,
                    group=ev.group,
                    rank=ev.rank,
                    payload=event_payload(ev),
                )
                for ev in events
            ]
            coord.submit(records, _Request(self, src, rid, records, lane), None)
        elif kind == "proposal":
            _, rid, payload = msg
            rec = NewRecord(kind="proposal", group=GROUP, payload=dict(payload))
            key = payload.get("idempotency_key")
            coord.submit(
                [rec],
                _Request(self, src, rid, [rec], EVENTS),
                ("idempotency", GROUP, key) if key else None,
            )
        else:  # "death", "create" or "record" (an operator's record: a facet's input)
            _, rid, rec = msg
            coord.submit([rec], _Request(self, src, rid, [rec], EVENTS), None)

    def answer(self, req: _Request) -> None:
        """Every input of a request has its outcome: send the answer back."""
        if req.src is None or self.coord is None:
            return
        results = []
        for rec, outcome in zip(req.records, req.results, strict=True):
            if isinstance(outcome, Appended):
                results.append({"offset": outcome.offset})
                self.answered.append((outcome.offset, rec.kind, rec.group, rec.rank, rec.payload))
            elif isinstance(outcome, Refusal):
                out: dict[str, Any] = {"error": outcome.code, "detail": outcome.detail}
                if outcome.offset is not None:
                    out["offset"] = outcome.offset
                results.append(out)
            else:
                assert isinstance(outcome, Existing)
                results.append({"offset": outcome.id})
        self.send(COORD, req.src, ("answer", req.rid, req.lane, tuple(results)))

    def appended(self) -> None:
        self.changed = True

    # -- faults and the cluster's own life ---------------------------------------------------------

    def start_process(self, rank: int) -> None:
        self.incarnations += 1
        old = self.procs.get(rank)
        if old is not None and old.alive:
            if old.running:
                old.alive = False  # the supervisor restarts the rank
            else:
                self.zombies.append(old)  # stopped, not dead: it will resume, and must be fenced
        proc = self.procs[rank] = Process(self, rank, f"r{rank}-{self.incarnations}")
        proc.feed(Start(proc.now()))

    def create_group(self) -> None:
        if self.create_rid is None and self.log and self.log[0].kind == "group_created":
            return
        rid = self.create_rid = self.rid()
        payload = {"world_size": self.setup.ranks, "config": self.setup.config}
        rec = NewRecord(kind="group_created", group=GROUP, payload=payload)
        self.send(OPERATOR, COORD, ("create", rid, rec))
        self.at(self.now + S, self.create_group)

    def operator_record(self, rec: NewRecord) -> None:
        """The operator sends a record's input to the coordinator (a facet's route: an epoch's
        plan, say); the answer is not waited for."""
        self.send(OPERATOR, COORD, ("record", self.rid(), rec))

    def start_coordinator(self) -> None:
        self.coord_epoch += 1
        self.coord = SimHost(self, self.coord_epoch)

    def crash_now(self) -> None:
        """The coordinator dies: its queue, buffered beats and parked polls are gone; the log,
        the snapshot and the projection rows written survive."""
        coord = self.coord
        if coord is None:
            return
        for item in coord.core.queue:
            item.fail(RuntimeError("crashed"))
        self.coord = None
        self.at(self.now + self.down_for, self.start_coordinator)

    def fault(self, f: Fault) -> None:
        kind, args = f.kind, f.args
        if kind == "partition":
            side, duration = args
            cut = frozenset(side)
            self.cuts.append(cut)
            self.at(self.now + duration, self.heal, cut)
            self.network_changed()
        elif kind == "crash":
            down, mid_batch = args
            if self.coord is None:
                return
            self.down_for = down
            if mid_batch:
                self.coord.crash_after_append = True
            else:
                self.crash_now()
        elif kind == "kill":
            rank, report, replace = args
            proc = self.procs.get(rank)
            if proc is None or not proc.alive:
                return
            proc.alive = False
            self.network_changed()
            self.supervise(proc, report, replace)
        elif kind == "zombie":
            rank, pause, report, replace = args
            proc = self.procs.get(rank)
            if proc is None or not proc.running:
                return
            proc.paused_until = self.now + pause
            self.at(proc.paused_until, self.resume, proc)
            self.network_changed()
            self.supervise(proc, report, replace)
        elif kind == "pause":
            rank, duration = args
            proc = self.procs.get(rank)
            if proc is None or not proc.running:
                return
            proc.paused_until = self.now + duration
            self.at(proc.paused_until, self.resume, proc)
            self.network_changed()
        elif kind == "rejoin":
            proc = self.procs.get(args[0])
            if proc is not None:
                proc.feed(Rejoin(proc.now()))
        elif kind == "close":
            rank, replace = args
            proc = self.procs.get(rank)
            if proc is not None and proc.alive:
                proc.close()
                if replace is not None:
                    self.at(self.now + replace, self.replace_closed, proc)
        elif kind == "reassign":
            rank, later = args
            for op, delay in (("deactivate", 0), ("activate", later)):
                payload = {"op": op, "ranks": [rank], "proposer": "operator"}
                msg = ("proposal", self.rid(), payload)
                self.at(self.now + delay, self.send, OPERATOR, COORD, msg)
        elif kind == "clock":
            self.clock_offset += args[0]
            if self.coord is not None:
                self.coord.ticker()
        else:
            op, ranks, key, copies = args
            payload: dict[str, Any] = {"op": op, "ranks": list(ranks), "proposer": "operator"}
            if key is not None:
                payload["idempotency_key"] = key
            rid = self.rid()
            for i in range(copies):
                self.at(
                    self.now + i * 300 * MS, self.send, OPERATOR, COORD, ("proposal", rid, payload)
                )

    def supervise(self, proc: Process, report: int | None, replace: int | None) -> None:
        """The supervisor takes the process for dead: it may report the death (racing the
        process's last heartbeats) and start a replacement, which the upper layer then asks
        to activate (twice: two places ask for the same recovery)."""
        if report is not None:
            rec = NewRecord(
                kind="death_reported",
                group=GROUP,
                rank=proc.rank,
                payload={"reporter": "supervisor", "incarnation": proc.incarnation},
            )
            self.at(self.now + report, self.send, SUPERVISOR, COORD, ("death", 0, rec))
        if replace is not None:
            self.at(self.now + replace, self.start_process, proc.rank)
            payload = {"op": "activate", "ranks": [proc.rank], "proposer": "operator"}
            for i in range(2):
                msg = ("proposal", self.rid(), payload)
                self.at(self.now + replace + (2 + i) * S, self.send, OPERATOR, COORD, msg)

    def replace_closed(self, proc: Process) -> None:
        if self.procs.get(proc.rank) is proc and not proc.alive:
            self.start_process(proc.rank)

    def heal(self, cut: frozenset[Any]) -> None:
        self.cuts.remove(cut)
        self.network_changed()

    def resume(self, proc: Process) -> None:
        if proc.alive:
            proc.feed(Tick(proc.now()))
        self.network_changed()

    def network_changed(self) -> None:
        for proc in [*self.procs.values(), *self.zombies]:
            if proc.running:
                proc.probe_later()

    # -- running and checking --------------------------------------------------------------------

    def run(self, quiet_s: float = 0.0) -> World:
        """Run ``steps`` events, checking the invariants after each; then, with ``quiet_s``,
        stop the faults and run that much more simulated time and check that the cluster
        converged; then the final replay."""
        self.down_for = S
        self.start_coordinator()
        self.at(0, self.create_group)
        start = random.Random(f"start-{self.seed}")
        for rank in range(self.setup.ranks):
            self.at(start.randrange(0, S // 2), self.start_process, rank)
        for f in self.faults:
            self.at(f.t, self.fault, f)
        for _, part in self.facet_sims:
            part.start()
        self._advance(lambda: self.step < self.steps)
        if quiet_s:
            # no fault starts any more; those under way end as scheduled
            self._queue = [e for e in self._queue if e[2] != self.fault]
            heapq.heapify(self._queue)
            end = self.now + round(quiet_s * S)
            self._advance(lambda: self._queue[0][0] <= end)
            self.now = max(self.now, end)
            self.converged()
        self.finish()
        return self

    def _advance(self, more: Any) -> None:
        queue = self._queue
        while queue and more():
            t, _, fn, args = heapq.heappop(queue)
            self.now = t
            if fn(*args) is STALE:
                continue  # a timer that found nothing to do (an answered request's timeout)
            self.step += 1
            self.check()

    def converged(self) -> None:
        """Once the faults have stopped long enough, every running agent holds the current
        view (checked when the group formed, was not shut down, has no change in flight and
        committed its current view at least ``SETTLE_NS`` before the end)."""
        coord = self.coord
        if coord is None:
            return
        status = coord.machine.group_status(GROUP)
        view = coord.machine.current_view(GROUP)
        if (
            status is None
            or view is None
            or status["formation"]["status"] != "formed"
            or status["shutdown"] is not None
            or status["change_in_flight"] is not None
            or self.wall() - view.ts < SETTLE_NS
        ):
            return
        held = [
            (p.rank, p.incarnation, None if p.machine.view is None else p.machine.view.version)
            for p in self.procs.values()
            if p.running
        ]
        self.inv.check_converged(view.version, held)
        self.settled = True

    def check(self) -> None:
        """The invariants that concern the step just taken."""
        inv = self.inv
        if self.changed or self.answered:
            inv.check_log_gap_free_and_kept(self.log, self.answered)
            self.all_answered += self.answered
            self.answered.clear()
            self.changed = False
            coord = self.coord
            if coord is not None and GROUP in inv.groups:
                status = coord.machine.group_status(GROUP)
                assert status is not None
                inv.check_status(GROUP, status)
                inv.check_terminal_still(coord.machine.proposal)
                for _, part in self.facet_sims:
                    part.check(coord, status)

    def finish(self) -> None:
        """A fresh fold of the whole log: effects, projections and state equal the run's."""
        self.inv.check_log_gap_free_and_kept(self.log, self.all_answered + self.answered)
        fresh = Coordinator()
        rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        for rec in self.log:
            effects = fresh.step(rec)
            self.inv.on_record(rec, effects)  # compared byte for byte with the first fold
            for effect in effects:
                for row in rows_for(effect):
                    rows[(row.kind, row.group, row.seq)] = row.doc
        if self.coord is None:
            self.start_coordinator()
            self.check()
        assert self.coord is not None
        written = {k: v for k, v in self.projections.items()}
        self.inv.check_projections(written, rows)
        machine = self.coord.machine
        run = msgspec.json.encode(
            [machine.snapshot(), *map(machine.group_status, machine.groups())]
        )
        again = msgspec.json.encode([fresh.snapshot(), *map(fresh.group_status, fresh.groups())])
        if run != again:
            raise Violation("replay_identical", "the run's fold and a fresh replay differ")


# -- running seeds, shrinking ------------------------------------------------------------------


class Failure(NamedTuple):
    seed: int
    steps: int
    keep: tuple[int, ...] | None
    violation: Violation

    def reproduction(self) -> str:
        faults = "" if self.keep is None else f" --faults {','.join(map(str, self.keep)) or 'none'}"
        return f"python -m tests.sim --seed {self.seed} --steps {self.steps}{faults}"


def run_seed(seed: int, steps: int, keep: set[int] | None = None) -> Failure | None:
    """Run one seed; None when every invariant held, else the failure (at the failing step)."""
    world = World(seed, steps, keep)
    try:
        world.run()
    except Violation as v:
        return Failure(seed, world.step, None if keep is None else tuple(sorted(keep)), v)
    return None


def shrink(failure: Failure, *, budget: int = 200) -> Failure:
    """A smaller schedule that still breaks the same invariant: the run cut at the failing
    step, then each fault dropped in turn while the run still fails."""
    seed = failure.seed
    name = failure.violation.name
    n = len(setup(seed).faults)
    keep = set(range(n)) if failure.keep is None else set(failure.keep)
    best = failure
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for i in sorted(keep):
            tries += 1
            got = run_seed(seed, best.steps, keep - {i})
            if got is not None and got.violation.name == name:
                keep.discard(i)
                best = got
                progress = True
    if best.keep is None:
        best = Failure(seed, best.steps, tuple(sorted(keep)), best.violation)
    return best


def describe(failure: Failure) -> str:
    """The one-line reproduction and the shrunk schedule, for a failing seed."""
    small = shrink(failure)
    faults = setup(failure.seed).faults
    lines = [
        f"seed {failure.seed} broke {failure.violation}",
        f"reproduce: {failure.reproduction()}",
        f"shrunk:    {small.reproduction()}  ({small.violation.name})",
    ]
    lines += [f"  [{i}] {faults[i]}" for i in small.keep or ()]
    return "\n".join(lines)


__all__ = ["Fault", "Failure", "World", "describe", "run_seed", "setup", "shrink"]
