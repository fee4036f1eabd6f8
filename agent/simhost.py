"""Simulated agent hosts: the real agent state machine for many ranks, over the real wire.

A :class:`SimulatedHost` is one node of a job, carrying several ranks the way a node's agents
behind the launcher's relay do: one :class:`agent.machine.AgentMachine` per rank (the same
machine every real agent runs) and one host channel (``GET /agents/channel``, a WebSocket: see
``agent.channel``) for all of them, which carries their events batched per lane (each event
with its rank's own token when auth is on) and brings the updates the coordinator pushes for
the host's ranks, each of which every machine folds as its own. With ``channel=False`` it
speaks the plain HTTP endpoints instead, as a host without the channel would: one
``POST /agents/events`` per batch and one long poll ``GET /agents/updates?ranks=...``.
Only the data plane is simulated: it is ready as soon as the store is known, and a committed
view is "built" at once, or ``build_s`` seconds after the view arrived, as a real data plane
that takes time to connect the members (the evidence it then reports: nothing down).

A :class:`SimulatedCluster` is many hosts in one event loop: a whole group of thousands of
ranks in one process, for the tests and benchmarks that must run the protocol at the scale the
product claims. Faults are the ones a real job sees: a process killed (its machine says nothing
more), a death reported by a supervisor, a replacement with a new incarnation, a clean exit.

Nothing here is a second implementation of the protocol: what each rank sends and how it reads
an update is decided by ``AgentMachine``; this module only carries bytes and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
from msgspec.structs import replace

from ..wire import ranks as rank_sets
from ..wire.protocol import FEATURES, MAX_EVENTS, PROTOCOL, AgentEventBase, View
from ..wire.updates import AgentUpdate, addressed_rank
from . import facets
from .channel import ChannelClosed, ChannelLink, ChannelRefused, HostChannel
from .driver import Driver
from .httplite import Connection, HttpError
from .machine import (
    BEATS,
    EVENTS,
    AgentConfig,
    AgentMachine,
    Close,
    ConnectDataPlane,
    DataPlaneReady,
    EventsAnswered,
    EventsFailed,
    InstallView,
    LinkEvidence,
    MoveDataPlane,
    PollFailed,
    PollUpdates,
    RankStateChanged,
    SendEvents,
    ShutdownWithSave,
    Start,
    Stopped,
    StoreAddress,
    Tick,
    UpdatesReceived,
)

#: How long one long poll waits on the coordinator before answering empty.
POLL_TIMEOUT_S = 10.0
#: The direction of the updates, for :meth:`SimulatedHost.mute`.
UPDATES = "updates"
#: How long a call may take before its coordinator counts as unreachable (a long poll gets
#: its own wait on top).
REQUEST_TIMEOUT_S = 5.0

_encode = msgspec.json.encode


class SimulatedHost:
    """Several ranks of one group behind one node's channel; see the module docstring."""

    def __init__(
        self,
        address: tuple[str, int] | Sequence[tuple[str, int]],
        group: str,
        ranks: Iterable[int],
        world_size: int,
        *,
        heartbeat_interval_s: float = 1.0,
        tokens: Mapping[int, str] | None = None,
        on_change: Callable[[], None] | None = None,
        data_plane_ready: bool = True,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        channel: bool = True,
        build_s: float = 0.0,
    ) -> None:
        self.address = address
        #: seconds the simulated data plane takes to build a committed view (0: at once)
        self.build_s = build_s
        #: whether the host speaks the host channel (else the plain HTTP endpoints)
        self.channel = channel
        #: False: the simulated data plane never becomes ready (its rank stays SYNCED)
        self.data_plane_ready = data_plane_ready
        self.group = group
        self.world_size = world_size
        self.heartbeat_interval_s = heartbeat_interval_s
        self.tokens = dict(tokens or {})
        self.on_change = on_change
        self.machines: dict[int, AgentMachine] = {}
        #: each rank's machine in the driver every agent host uses (``agent.driver``)
        self.drivers: dict[int, _Rank] = {}
        for rank in ranks:
            self._add(rank)
        #: ranks whose process is gone (killed or stopped): their machines get no more input
        self.dead: set[int] = set()
        #: rank -> the directions it is cut off in (see :meth:`mute`)
        self.muted: dict[int, set[str]] = {}
        self.stopped: dict[int, Stopped] = {}
        self.states: dict[int, str] = {}
        self.shutdowns: list[ShutdownWithSave] = []
        #: every (event, result) the coordinator answered, when a test wants an audit trail
        self.sent: list[tuple[AgentEventBase, Mapping[str, Any]]] | None = None
        self.requests = 0
        self._outbox: dict[str, deque[tuple[int, tuple[AgentEventBase, ...]]]] = {
            EVENTS: deque(),
            BEATS: deque(),
        }
        self._lane_ready = {EVENTS: asyncio.Event(), BEATS: asyncio.Event()}
        self._polls: dict[int, PollUpdates] = {}
        self._poll_ready = asyncio.Event()
        self._timers: list[tuple[float, int]] = []
        self._scheduled: dict[int, float] = {}
        self._timer_changed = asyncio.Event()
        auth = f"Bearer {','.join(self.tokens[r] for r in sorted(self.tokens))}" if tokens else None
        addresses = [address] if isinstance(address, tuple) else list(address)
        self.addresses = addresses
        #: the plain HTTP wire: a keep-alive connection per lane and one for the long poll
        self._conns = {
            name: Channel(addresses, auth, request_timeout_s) for name in (EVENTS, BEATS, "poll")
        }
        #: the host channel: where it is opened, the open one, and what it carries: its ranks
        #: and the offset up to which it has delivered every update to each of them
        self._link = ChannelLink(addresses, authorization=auth, timeout_s=request_timeout_s)
        self._channel: HostChannel | None = None
        self._relink = asyncio.Event()
        self._stream: tuple[frozenset[int], int] | None = None
        #: bytes of the updates pushed on channels that ended, and of the events answers the
        #: host received on channels, by lane (frame headers included)
        self._pushed_before = 0
        self.bytes_answered = {EVENTS: 0, BEATS: 0}
        self._backoff = 0.0
        self._busy = {EVENTS: False, BEATS: False}
        self._flush_soon = False
        self.request_timeout_s = request_timeout_s
        self._tasks: list[asyncio.Task[None]] = []

    def _add(self, rank: int, incarnation: str | None = None) -> None:
        """A new process for ``rank``: its machine, and its driver."""
        machine = AgentMachine(
            AgentConfig(
                group=self.group,
                rank=rank,
                incarnation=incarnation or uuid.uuid4().hex,
                world_size=self.world_size,
                heartbeat_interval_s=self.heartbeat_interval_s,
            )
        )
        self.machines[rank] = machine
        self.drivers[rank] = _Rank(self, rank, machine)

    # -- what a test or benchmark reads ------------------------------------------------------------

    @property
    def live_ranks(self) -> list[int]:
        return sorted(r for r in self.machines if r not in self.dead)

    def view(self, rank: int) -> View | None:
        return self.machines[rank].view

    @property
    def bytes_pushed(self) -> int:
        """Every byte of updates the coordinator pushed this host's channels."""
        channel = self._channel
        return self._pushed_before + (channel.bytes_pushed if channel is not None else 0)

    @property
    def bytes_received(self) -> int:
        """Every byte the coordinator sent this host (headers and frame headers included)."""
        return (
            sum(c.bytes_received for c in self._conns.values())
            + self.bytes_pushed
            + sum(self.bytes_answered.values())
        )

    @property
    def update_bytes(self) -> int:
        """The bytes of the updates and of the answers to events other than heartbeats (what
        a view change costs the host; the beats' answers are a steady cost of their own)."""
        return (
            self._conns["poll"].bytes_received
            + self._conns[EVENTS].bytes_received
            + self.bytes_pushed
            + self.bytes_answered[EVENTS]
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.channel:
            self._tasks = [loop.create_task(self._link_loop())]
        else:
            self._tasks = [
                loop.create_task(self._send_loop(EVENTS)),
                loop.create_task(self._send_loop(BEATS)),
                loop.create_task(self._poll_loop()),
            ]
        self._tasks.append(loop.create_task(self._timer_loop()))
        now = time.monotonic()
        for rank in list(self.machines):
            self._start(rank, now)

    def _start(self, rank: int, now: float) -> None:
        # the simulated data plane needs no store: it is ready from the start
        self._step(rank, Start(now))
        if self.data_plane_ready:
            self._step(rank, DataPlaneReady(now))

    async def close(self, timeout: float = 10.0) -> None:
        """Every live rank leaves cleanly (``exit``), then the host stops."""
        now = time.monotonic()
        for rank in self.live_ranks:
            self._step(rank, Close(now))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while any(r not in self.stopped for r in self.live_ranks):
                    await asyncio.sleep(0.01)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once, like the node losing power: nothing more is sent."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, HttpError, OSError):
                await task
        self._tasks = []
        for conn in self._conns.values():
            await conn.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # -- faults ------------------------------------------------------------------------------------

    def kill(self, rank: int) -> None:
        """The rank's process dies (SIGKILL): its machine gets no more input, sends nothing."""
        self.dead.add(rank)
        self._polls.pop(rank, None)
        for lane in self._outbox.values():
            kept = [(r, evs) for r, evs in lane if r != rank]
            lane.clear()
            lane.extend(kept)

    def mute(self, rank: int, *lanes: str) -> None:
        """Cut the rank off in some directions, as a partial network failure would:
        ``"events"`` and ``"beats"`` (what it sends fails to arrive; the machine retries),
        ``"updates"`` (it hears nothing: a hung rank that keeps beating never ACKs)."""
        self.muted.setdefault(rank, set()).update(lanes or (EVENTS, BEATS, UPDATES))

    def unmute(self, rank: int) -> None:
        self.muted.pop(rank, None)
        self._poll_ready.set()
        self._relink.set()  # the channel carries the rank's updates again, from where it is
        for lane in (EVENTS, BEATS):
            self._lane_ready[lane].set()
        if self.channel:
            self._pending()

    def replace(self, rank: int) -> str:
        """A new process for ``rank`` (a new incarnation) starts and joins; its incarnation."""
        incarnation = uuid.uuid4().hex
        self._add(rank, incarnation)
        self.dead.discard(rank)
        self.stopped.pop(rank, None)
        self._start(rank, time.monotonic())
        return incarnation

    async def report_death(self, rank: int, timeout: float = 30.0) -> tuple[int, Any]:
        """What a supervisor does when it sees the process die: ``POST /agents/deaths``."""
        machine = self.machines[rank]
        body = {"group": self.group, "rank": rank, "incarnation": machine.config.incarnation}
        token = self.tokens.get(rank)
        channel = Channel(self._conns[EVENTS].addresses, f"Bearer {token}" if token else None)
        try:
            return await channel.request("POST", "/agents/deaths", body, timeout=timeout)
        finally:
            await channel.close()

    # -- the machines ------------------------------------------------------------------------------

    def _step(self, rank: int, event: Any) -> None:
        if rank in self.dead:
            return
        deadline = self.drivers[rank].feed(event)
        if deadline is not None:
            scheduled = self._scheduled.get(rank)
            if scheduled is None or deadline < scheduled:
                self._schedule(rank, deadline)

    def _built(self, rank: int, version: int) -> None:
        """The data plane finished building view ``version`` (``build_s`` after it came)."""
        self._step(rank, LinkEvidence(time.monotonic(), version, {}))

    def _schedule(self, rank: int, deadline: float) -> None:
        """One timer per rank, the earliest it needs (a later one is re-read when it fires)."""
        scheduled = self._scheduled.get(rank)
        if scheduled is None or deadline < scheduled:
            self._scheduled[rank] = deadline
            heapq.heappush(self._timers, (deadline, rank))
            self._timer_changed.set()

    # -- what the host does with a rank's actions (``_Rank``) --------------------------------------

    def _send_events(self, rank: int, action: SendEvents) -> None:
        self._outbox[action.lane].append((rank, action.events))
        if self.channel:
            self._pending()
        else:
            self._lane_ready[action.lane].set()

    def _poll_updates(self, rank: int, action: PollUpdates) -> None:
        self._polls[rank] = action
        if not self.channel:
            self._poll_ready.set()
            return
        stream = self._stream
        if stream is None or rank not in stream[0] or action.after < stream[1]:
            # the channel does not serve this rank from its offset on: the rank is not
            # carried, or it missed pushes (a replacement starts from 0, a reset machine
            # reads again from the start)
            self._relink.set()

    def _install_view(self, rank: int, action: InstallView) -> LinkEvidence | None:
        """A built view: every member reached, nothing down (at once, or ``build_s`` later)."""
        self._changed()
        view = action.view
        if not view.is_active(rank):
            return None
        if self.build_s > 0:
            asyncio.get_running_loop().call_later(self.build_s, self._built, rank, view.version)
            return None
        return LinkEvidence(time.monotonic(), view.version, {})

    def _data_plane(self, rank: int) -> DataPlaneReady | None:
        """The simulated data plane is ready on any store at once (unless it never is)."""
        return DataPlaneReady(time.monotonic()) if self.data_plane_ready else None

    def _rank_state(self, rank: int, action: RankStateChanged) -> None:
        self.states[rank] = action.state
        self._changed()

    def _stopped(self, rank: int, action: Stopped) -> None:
        self.stopped[rank] = action
        self.dead.add(rank)
        self._polls.pop(rank, None)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- the wire ----------------------------------------------------------------------------------

    def _take(self, lane: str) -> tuple[list[tuple[int, Any]], list[AgentEventBase]]:
        """The next batch of a lane: what its ranks queued, up to ``MAX_EVENTS`` events, less
        what a muted rank sent (lost: its machine hears so); and the events to send."""
        outbox = self._outbox[lane]
        batch: list[tuple[int, tuple[AgentEventBase, ...]]] = []
        count = 0
        while outbox and count + len(outbox[0][1]) <= MAX_EVENTS:
            item = outbox.popleft()
            batch.append(item)
            count += len(item[1])
        if self.muted:
            lost = [(r, evs) for r, evs in batch if lane in self.muted.get(r, ())]
            if lost:
                now = time.monotonic()
                batch = [(r, evs) for r, evs in batch if lane not in self.muted.get(r, ())]
                for rank, _ in lost:
                    self._step(rank, EventsFailed(now, "the network lost it (muted)", lane))
        if self.tokens:
            events = [replace(e, token=self.tokens[rank]) for rank, evs in batch for e in evs]
        else:
            events = [e for _, evs in batch for e in evs]
        return batch, events

    def _answered(
        self, lane: str, batch: list[tuple[int, Any]], events: list[Any], body: Any, now: float
    ) -> None:
        """Each rank of a batch its share of the answer's results."""
        results = body["results"]
        if self.sent is not None:
            self.sent.extend(zip(events, results, strict=True))
        if len(batch) == len(results):  # one event each (nearly always): no slicing
            for (rank, _), result in zip(batch, results, strict=True):
                self._step(rank, EventsAnswered(now, (result,), lane))
            return
        at = 0
        for rank, evs in batch:
            self._step(rank, EventsAnswered(now, tuple(results[at : at + len(evs)]), lane))
            at += len(evs)

    async def _send_loop(self, lane: str) -> None:
        """One batch in flight per lane: what every rank queued meanwhile, in one request."""
        outbox, ready, conn = self._outbox[lane], self._lane_ready[lane], self._conns[lane]
        while True:
            await ready.wait()
            ready.clear()
            while outbox:
                batch, events = self._take(lane)
                if not batch:
                    continue
                self.requests += 1
                try:
                    status, body = await conn.request(
                        "POST", "/agents/events", _encode({"events": events})
                    )
                except (HttpError, OSError, TimeoutError) as exc:
                    now = time.monotonic()
                    for rank, _ in batch:
                        self._step(rank, EventsFailed(now, str(exc), lane))
                    continue
                now = time.monotonic()
                if status != 200:
                    detail = f"{status}: {body}"
                    for rank, _ in batch:
                        self._step(rank, EventsFailed(now, detail, lane))
                    continue
                self._answered(lane, batch, events, body, now)

    async def _poll_loop(self) -> None:
        """One long poll for every rank of the host that asked for one."""
        conn = self._conns["poll"]
        while True:
            await self._poll_ready.wait()
            self._poll_ready.clear()
            polls = {
                r: p
                for r, p in self._polls.items()
                if r not in self.dead and UPDATES not in self.muted.get(r, ())
            }
            if not polls:
                continue
            delay = min(p.delay_s for p in polls.values())
            if delay > 0:
                await asyncio.sleep(delay)
            for rank in polls:
                del self._polls[rank]
            after = min(p.after for p in polls.values())
            views = {p.view for p in polls.values()}
            query = (
                f"/agents/updates?group={self.group}&ranks={rank_sets.format_query(polls)}"
                f"&after={after}&timeout={POLL_TIMEOUT_S}&protocol={PROTOCOL}"
                f"&features={','.join(FEATURES)}"
            )
            if len(views) == 1 and (view := views.pop()) is not None:
                query += f"&view={view}"
            self.requests += 1
            try:
                status, body = await conn.request(
                    "GET", query, timeout=POLL_TIMEOUT_S + self.request_timeout_s
                )
            except (HttpError, OSError, TimeoutError) as exc:
                status, body = 0, str(exc)
            now = time.monotonic()
            if status != 200:
                for rank in polls:
                    self._step(rank, PollFailed(now, f"{status}: {body}"))
                continue
            self._deliver(polls, body, now)

    def _deliver(self, ranks: Iterable[int], body: Mapping[str, Any], now: float) -> None:
        """An updates answer (a long poll's, or a channel's push) to each of ``ranks`` that
        is alive and hears: the group's updates and its own."""
        store = body.get("store")
        address = StoreAddress(store["host"], store["port"], store.get("id", "")) if store else None
        shared: list[AgentUpdate] = []
        own: dict[int, list[AgentUpdate]] = {}
        for u in facets.UPDATES.decode_updates(body["updates"]):
            rank = addressed_rank(u)
            if rank is None:
                shared.append(u)
            else:
                own.setdefault(rank, []).append(u)
        next_after, resync, restored = (
            body["next_after"],
            body["resync"],
            bool(body.get("restored")),
        )
        common = UpdatesReceived(now, tuple(shared), next_after, address, resync, restored)
        dead, muted = self.dead, self.muted
        for rank in ranks:
            if rank in dead or (muted and UPDATES in muted.get(rank, ())):
                continue  # cut off while this was in flight: it never hears it
            if rank in own:
                updates = tuple(sorted([*shared, *own[rank]], key=_offset))
                self._step(
                    rank, UpdatesReceived(now, updates, next_after, address, resync, restored)
                )
            else:
                self._step(rank, common)
        if self.channel:
            self._flush_lanes()  # the ACKs of this push leave now, not after every other push

    # -- the wire: the host channel ----------------------------------------------------------------

    def _carried(self) -> list[int]:
        """The ranks whose updates the channel should carry: those alive and not cut off."""
        return sorted(
            r for r in self.machines if r not in self.dead and UPDATES not in self.muted.get(r, ())
        )

    def _covers(self, ranks: frozenset[int], after: int) -> bool:
        """Whether a channel carrying ``ranks`` from ``after`` on serves every rank's poll."""
        for rank in self._carried():
            poll = self._polls.get(rank)
            if rank not in ranks or (poll is not None and poll.after < after):
                return False
        return True

    async def _link_loop(self) -> None:
        """Keep one channel open for the host's ranks: open it from the lowest offset they
        need, and again whenever it ends or stops covering a rank (a replacement starts from
        offset 0, a rank heard nothing while cut off)."""
        self._relink.set()
        while True:
            await self._relink.wait()
            self._relink.clear()
            ranks = self._carried()
            polls = [self._polls[r] for r in ranks if r in self._polls]
            delay = min((p.delay_s for p in polls), default=0.0)
            if delay > 0:
                await asyncio.sleep(delay)
                ranks = self._carried()
                polls = [self._polls[r] for r in ranks if r in self._polls]
            after = min((p.after for p in polls), default=0)
            views = {p.view for p in polls}
            carried = tuple(ranks)
            try:
                channel = await self._link.open(
                    group=self.group if carried else None,
                    ranks=carried,
                    after=after,
                    view=views.pop() if len(views) == 1 else None,
                    on_updates=lambda body, carried=carried: self._pushed(carried, body),
                )
            except (ChannelRefused, ChannelClosed, OSError, TimeoutError) as exc:
                now = time.monotonic()
                self._relink.set()
                for rank in carried:
                    self._step(rank, PollFailed(now, str(exc)))
                if not carried:
                    await asyncio.sleep(self._link_backoff())
                continue
            self._backoff = 0.0
            self.requests += 1
            self._channel, self._stream = channel, (frozenset(carried), after)
            if self._covers(*self._stream):
                self._relink.clear()  # what machines asked while it opened is covered
            self._flush_lanes()  # what waited for a channel
            relink = asyncio.ensure_future(self._relink.wait())
            try:
                await asyncio.wait([channel.ended, relink], return_when=asyncio.FIRST_COMPLETED)
            finally:
                relink.cancel()
            self._channel, self._stream = None, None
            self._pushed_before += channel.bytes_pushed
            self._link.closed(channel)
            if channel.closed is None:
                channel.close()  # to open one that covers every rank
                continue
            now = time.monotonic()
            self._relink.set()
            for rank in carried:
                self._step(rank, PollFailed(now, str(channel.closed)))

    def _pushed(self, carried: tuple[int, ...], body: Mapping[str, Any]) -> None:
        """A push: the channel has delivered everything up to its ``next_after`` (a rank that
        later asks from before it missed some: see ``_poll_updates``); then the machines fold it."""
        stream = self._stream
        if stream is not None:
            next_after = int(body["next_after"])
            at = next_after if body.get("resync") else max(stream[1], next_after)
            self._stream = (stream[0], at)
        self._deliver(carried, body, time.monotonic())

    def _link_backoff(self) -> float:
        self._backoff = min(max(self._backoff * 2, 0.05), 2.0)
        return self._backoff

    def _pending(self) -> None:
        """Events wait in a lane: the entry point that stepped the machines sends them when it
        is done (:meth:`_flush_lanes`), so a host's ranks' events of one push leave together
        and at once; a callback soon after catches any other way in."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_lanes)

    def _flush_lanes(self) -> None:
        """Send each lane's next batch over the channel unless one is in flight (one at a
        time per lane, as the machines' lanes are); without a channel they wait for one."""
        self._flush_soon = False
        channel = self._channel
        if channel is None:
            return
        for lane in (EVENTS, BEATS):
            if self._busy[lane] or not self._outbox[lane]:
                continue
            batch, events = self._take(lane)
            if not batch:
                continue
            self._busy[lane] = True
            self.requests += 1
            sent = channel.send(events, timeout=self.request_timeout_s)
            sent.add_done_callback(
                lambda done, lane=lane, batch=batch, events=events, channel=channel: self._sent(
                    lane, batch, events, channel, done
                )
            )

    def _sent(
        self,
        lane: str,
        batch: list[tuple[int, Any]],
        events: list[Any],
        channel: HostChannel,
        done: asyncio.Future[Any],
    ) -> None:
        """A batch's answer came (or the channel ended, or no answer in time)."""
        self._busy[lane] = False
        now = time.monotonic()
        exc = done.exception()
        if exc is not None:
            if isinstance(exc, TimeoutError):
                channel.abort()  # the coordinator stopped answering: the link opens another
            for rank, _ in batch:
                self._step(rank, EventsFailed(now, str(exc), lane))
        else:
            body, nbytes = done.result()
            self.bytes_answered[lane] += nbytes
            if "error" in body:
                if body.get("leader"):
                    channel.close()  # to the leader it names (ChannelLink.closed)
                detail = f"{body['error']}: {body.get('detail')}"
                for rank, _ in batch:
                    self._step(rank, EventsFailed(now, detail, lane))
            else:
                self._answered(lane, batch, events, body, now)
        self._flush_lanes()

    async def _timer_loop(self) -> None:
        """Tick each machine when its deadline passes (a heap of deadlines, checked lazily)."""
        timers = self._timers
        while True:
            now = time.monotonic()
            while timers and timers[0][0] <= now:
                deadline, rank = heapq.heappop(timers)
                if self._scheduled.get(rank) != deadline:
                    continue  # superseded by an earlier one
                del self._scheduled[rank]
                machine = self.machines.get(rank)
                if machine is None or rank in self.dead:
                    continue
                due = machine.next_deadline()
                if due is not None and due <= now:
                    self._step(rank, Tick(now))
                elif due is not None:
                    self._schedule(rank, due)
            self._timer_changed.clear()
            timeout = None if not timers else max(0.0, timers[0][0] - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._timer_changed.wait()


class _Rank(Driver):
    """One rank of a simulated host: its machine in the driver every agent host uses, each
    action handed to the host with the rank's number."""

    def __init__(self, host: SimulatedHost, rank: int, machine: AgentMachine) -> None:
        super().__init__(machine)
        self.host, self.rank = host, rank

    def send_events(self, action: SendEvents) -> None:
        self.host._send_events(self.rank, action)

    def poll_updates(self, action: PollUpdates) -> None:
        self.host._poll_updates(self.rank, action)

    def install_view(self, action: InstallView) -> LinkEvidence | None:
        return self.host._install_view(self.rank, action)

    def connect_data_plane(self, action: ConnectDataPlane) -> DataPlaneReady | None:
        return self.host._data_plane(self.rank)

    def move_data_plane(self, action: MoveDataPlane) -> DataPlaneReady | None:
        return self.host._data_plane(self.rank)

    def rank_state_changed(self, action: RankStateChanged) -> None:
        self.host._rank_state(self.rank, action)

    def shutdown_with_save(self, action: ShutdownWithSave) -> None:
        self.host.shutdowns.append(action)

    def stopped(self, action: Stopped) -> None:
        self.host._stopped(self.rank, action)


class Channel:
    """One keep-alive connection to whichever coordinator of a list leads: a refused
    connection moves on to the next address, a ``503 not_leader`` to the leader it names (the
    rules of ``agent.client.CoordinatorClient``, for the simulated hosts' light client)."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        authorization: str | None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.addresses = list(addresses)
        self.authorization = authorization
        self._at = 0
        self._conn: Connection | None = None
        self.bytes_received = 0

    async def request(
        self, method: str, path: str, body: Any = None, *, timeout: float | None = None
    ) -> tuple[int, Any]:
        """One call, tried at each address in turn; a coordinator that does not answer in
        ``timeout`` seconds (frozen, say) counts as unreachable. A body that is not JSON is
        answered as ``(status, its text)``."""
        timeout = self.request_timeout_s if timeout is None else timeout
        tries = 0
        while True:
            reused = self._conn is not None
            if self._conn is None:
                self._conn = Connection(*self.addresses[self._at], authorization=self.authorization)
            conn = self._conn
            before = conn.bytes_received
            try:
                async with asyncio.timeout(timeout):
                    status, data = await conn.request(method, path, body)
            except msgspec.DecodeError as exc:
                await self.close()  # the rest of that answer is not ours to read
                return 500, f"an answer that is not JSON: {exc}"
            except (HttpError, OSError, TimeoutError) as exc:
                await self.close()
                if reused and not isinstance(exc, TimeoutError):
                    continue  # the server closed an idle keep-alive connection: a new one
                self._at = (self._at + 1) % len(self.addresses)
                tries += 1
                if tries >= len(self.addresses):
                    raise
                continue
            finally:
                self.bytes_received += conn.bytes_received - before
            leader = data.get("leader") if status == 503 and isinstance(data, dict) else None
            if leader and tries < 2 * len(self.addresses):
                address = _address(str(leader))
                if address != self.addresses[self._at]:
                    if address not in self.addresses:
                        self.addresses.append(address)
                    await self.close()
                    self._at = self.addresses.index(address)
                    tries += 1
                    continue
            return status, data

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "127.0.0.1", parts.port or 80


def _offset(update: AgentUpdate) -> int:
    return update.offset


class SimulatedCluster:
    """Every rank of one group, ``ranks_per_host`` to a simulated host, in one event loop (each
    host on its channel, or on the plain HTTP endpoints with ``channel=False``)."""

    def __init__(
        self,
        address: tuple[str, int] | Sequence[tuple[str, int]],
        group: str,
        world_size: int,
        *,
        ranks_per_host: int = 8,
        ranks: Sequence[int] | None = None,
        heartbeat_interval_s: float = 1.0,
        tokens: Mapping[int, str] | None = None,
        data_plane_ready: bool = True,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        channel: bool = True,
        build_s: float = 0.0,
    ) -> None:
        ranks = list(range(world_size)) if ranks is None else list(ranks)
        self.group = group
        self.world_size = world_size
        self._changed = asyncio.Condition()
        self._dirty = False
        self.hosts = [
            SimulatedHost(
                address,
                group,
                ranks[i : i + ranks_per_host],
                world_size,
                heartbeat_interval_s=heartbeat_interval_s,
                tokens={r: tokens[r] for r in ranks[i : i + ranks_per_host]} if tokens else None,
                on_change=self._note_change,
                data_plane_ready=data_plane_ready,
                request_timeout_s=request_timeout_s,
                build_s=build_s,
                channel=channel,
            )
            for i in range(0, len(ranks), ranks_per_host)
        ]
        self.host_of = {r: h for h in self.hosts for r in h.machines}
        #: where ``all_on`` found a rank behind last time
        self._behind = 0

    def _note_change(self) -> None:
        if not self._dirty:
            self._dirty = True
            asyncio.get_running_loop().call_soon(self._notify)

    def _notify(self) -> None:
        self._dirty = False

        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_running_loop().create_task(notify())

    async def start(self) -> None:
        for host in self.hosts:
            await host.start()

    async def stop(self) -> None:
        await asyncio.gather(*(h.stop() for h in self.hosts))

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.hosts))

    def kill(self, rank: int) -> None:
        self.host_of[rank].kill(rank)

    async def report_death(self, rank: int) -> tuple[int, Any]:
        return await self.host_of[rank].report_death(rank)

    def replace(self, rank: int) -> str:
        return self.host_of[rank].replace(rank)

    def mute(self, rank: int, *lanes: str) -> None:
        self.host_of[rank].mute(rank, *lanes)

    def unmute(self, rank: int) -> None:
        self.host_of[rank].unmute(rank)

    def machine(self, rank: int) -> AgentMachine:
        return self.host_of[rank].machines[rank]

    def view(self, rank: int) -> View | None:
        return self.host_of[rank].view(rank)

    @property
    def live_ranks(self) -> list[int]:
        return sorted(r for h in self.hosts for r in h.live_ranks)

    @property
    def stopped(self) -> dict[int, Stopped]:
        return {r: s for h in self.hosts for r, s in h.stopped.items()}

    @property
    def bytes_pushed(self) -> int:
        """Every byte of updates the coordinator pushed this host's channels."""
        channel = self._channel
        return self._pushed_before + (channel.bytes_pushed if channel is not None else 0)

    @property
    def bytes_received(self) -> int:
        return sum(h.bytes_received for h in self.hosts)

    @property
    def requests(self) -> int:
        return sum(h.requests for h in self.hosts)

    def all_on(self, version: int, ranks: Iterable[int] | None = None) -> bool:
        """Every rank named (every live rank by default) holds ``version`` or later. Checked
        after every change while a test or benchmark waits (``wait_until``), so it stops at the
        first rank behind, starting with the host that was behind last time, and lists or sorts
        nothing."""
        if ranks is not None:
            for rank in ranks:
                view = self.view(rank)
                if view is None or view.version < version:
                    return False
            return True
        hosts = self.hosts
        start = self._behind
        for i in range(len(hosts)):
            host = hosts[(start + i) % len(hosts)]
            dead = host.dead
            for rank, machine in host.machines.items():
                if rank in dead:
                    continue
                view = machine.view
                if view is None or view.version < version:
                    self._behind = (start + i) % len(hosts)
                    return False
        return True

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait (woken by each installed view or state change, never by sleeping) until
        ``predicate()`` holds; raises TimeoutError with what the ranks hold."""
        try:
            async with asyncio.timeout(timeout):
                async with self._changed:
                    await self._changed.wait_for(predicate)
        except TimeoutError:
            versions: dict[int | None, int] = {}
            for rank in self.live_ranks:
                view = self.view(rank)
                key = None if view is None else view.version
                versions[key] = versions.get(key, 0) + 1
            raise TimeoutError(
                f"not reached in {timeout} s; live ranks by view version: {versions}; "
                f"stopped: {len(self.stopped)}"
            ) from None
