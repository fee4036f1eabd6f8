"""The lighthouse facet's host part: the calls of torchft's lighthouse protocol, carried out on
a coordinator (``service.py`` serves them over gRPC, ``routes.py`` over HTTP).

- **A quorum call** (:meth:`LighthouseHost.quorum`) appends the member's request and waits
  until a quorum decided by the fold names that request (``fold.quorum_compute``); the answer
  is sent once the records that decided it are durable. The requests of a fast quorum's members
  share one append (one fsync per quorum): a request waits for the other members of the last
  quorum while that changes no decision, at most a tick of the rule
  (:meth:`LighthouseHost._gather`). A call that ends unanswered (its deadline, a
  cancel) is withdrawn in the log, so no later quorum counts on a caller that no longer waits.
- **Heartbeats** (:meth:`LighthouseHost.heartbeat`) wait for one shared record per flush
  interval, like the agents' (``coordinator/fold/heartbeats.py``): the log grows by one record
  per interval whatever the number of replica groups, and each beat is answered once that
  record is durable. The interval is ``serve --heartbeat-flush-s``, at most a tenth of the
  rule's heartbeat timeout.
- **Any coordinator answers.** A standby cannot append, so it carries the call to the leader
  (``POST /lighthouse/quorum``, ``POST /lighthouse/heartbeats`` with the operator token) and
  answers with what the leader answered; when the leader dies mid-call, it tries again, on the
  new leader or on itself once it leads, until the caller's deadline. A torchft manager that
  knows one coordinator keeps forming quorums through a failover, as long as that coordinator
  lives.
- **The rule's settings** (``serve --lighthouse-*``) are the log's: before its first call, a
  leader whose settings differ from the folded ones appends them (``lighthouse_configured``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any

import msgspec

from ...coordinator.host.facets import FacetHost
from ...coordinator.host.inputs import Appended, Existing, HostUnavailable, Outcome, Refusal
from ...coordinator.host.loop import Host
from ...coordinator.host.ready import HostState, Ready
from ...eventlog import NewRecord
from ...wire.codes import NOT_LEADER, REPLICA_LOST
from .effects import (
    LighthouseConfigured,
    QuorumDecided,
    ReplicaLost,
    Settings,
)
from .fold import (
    CONFIGURED,
    HEARTBEAT,
    LOST,
    REQUEST,
    WITHDRAWN,
    Lighthouse,
)
from .messages import Quorum, QuorumMember

log = logging.getLogger("foldplane.lighthouse")

#: How long a call waits before it tries again while no coordinator leads (a failover).
RETRY_S = 0.05
#: How often a quorum call waiting on this coordinator checks that it still leads.
LEAD_CHECK_S = 0.25
#: The flush interval of the shared heartbeat record, at most this share of the timeout.
FLUSH_SHARE = 0.1
#: How long, at most, a quorum request waits on the leader for the other members of the last
#: quorum (:meth:`LighthouseHost._gather`), in ticks of the rule (``quorum_tick_ms``): the
#: rule's own granularity of time.
GATHER_TICKS = 1


class LighthouseRefused(Exception):
    """The fold or the leader refused the call (``code``, ``detail``): it will not succeed as
    it is."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class LighthouseUnavailable(Exception):
    """No coordinator could take the call before its deadline (``detail`` says what failed)."""


def _notice(state: HostState, effect: Any, ready: Ready) -> None:
    ready.notices.append(effect)


def _say_quorum(effect: QuorumDecided) -> str | None:
    if not effect.changed:
        return None
    who = ", ".join(f"{m.replica_id}@{m.step}" for m in effect.participants)
    return f"lighthouse: quorum {effect.quorum_id} of [{who}]: {effect.reason}"


def _say_lost(effect: ReplicaLost) -> str:
    return (
        f"lighthouse: replica group {effect.replica!r} lost ({effect.reason}): "
        f"{list(effect.replica_ids)} out of every quorum"
    )


def _say_configured(effect: LighthouseConfigured) -> str:
    return f"lighthouse: quorum rule settings {msgspec.to_builtins(effect.settings)}"


HOST = FacetHost(
    carry={QuorumDecided: _notice},
    decisions={
        QuorumDecided: _say_quorum,
        ReplicaLost: _say_lost,
        LighthouseConfigured: _say_configured,
    },
)


def quorum_of(effect: QuorumDecided) -> Quorum:
    """The quorum an effect decided, as the protocol answers it."""
    return Quorum(
        quorum_id=effect.quorum_id, participants=effect.participants, created_ns=effect.created
    )


class _Waiter:
    """A quorum call on this coordinator: it is answered by the first quorum that names its
    request (``offset``) or a later one of the same replica group. Quorums decided before its
    offset is known are kept (``early``): the request's own step may decide one."""

    __slots__ = ("replica_id", "offset", "future", "early")

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.offset: int | None = None
        self.future: asyncio.Future[Quorum] = asyncio.get_running_loop().create_future()
        self.early: list[tuple[int, Quorum]] = []

    def heard(self, request: int, quorum: Quorum) -> None:
        if self.future.done():
            return
        if self.offset is None:
            self.early.append((request, quorum))
        elif request >= self.offset:
            self.future.set_result(quorum)

    def appended(self, offset: int) -> None:
        self.offset = offset
        for request, quorum in self.early:
            self.heard(request, quorum)
        self.early.clear()


class _Gathered:
    """A quorum request waiting to share an append (``LighthouseHost._gather``): the member, its
    record, and the future its caller waits on for the outcome."""

    __slots__ = ("member", "record", "asked")

    def __init__(
        self, member: QuorumMember, record: NewRecord, asked: asyncio.Future[Outcome]
    ) -> None:
        self.member = member
        self.record = record
        self.asked = asked


class LighthouseHost:
    """One coordinator's lighthouse: see the module docstring. ``settings``: the rule's
    settings this coordinator serves with (None: whatever the log holds); ``token``: the
    operator token it carries calls to the leader with."""

    def __init__(
        self,
        host: Host,
        settings: Settings | None = None,
        *,
        flush_s: float = 0.5,
        token: str | None = None,
    ) -> None:
        if settings is not None and (problem := settings.problem()):
            raise ValueError(problem)
        self.host = host
        self.settings = settings
        self.flush_s = flush_s
        self.token = token
        self._waiters: dict[str, list[_Waiter]] = {}
        self._beats: dict[str, list[asyncio.Future[None]]] = {}
        self._flush: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._configuring = asyncio.Lock()
        self._http: Any = None
        #: quorum requests waiting to share one append (``_gather``), with their callers
        self._gathered: list[_Gathered] = []
        self._gather_due: asyncio.TimerHandle | None = None
        host.listeners.append(self._heard)

    @property
    def fold(self) -> Lighthouse:
        return self.host.machine.facet("lighthouse")

    def leading(self) -> bool:
        """Whether this coordinator appends now (else a call goes to the leader)."""
        return self.host.role.name == "leader" and self.host.available() is None

    async def close(self) -> None:
        if self.host.listeners and self._heard in self.host.listeners:
            self.host.listeners.remove(self._heard)
        if self._flush is not None:
            self._flush.cancel()
        if self._gather_due is not None:
            self._gather_due.cancel()
        gathered, self._gathered = self._gathered, []
        for g in gathered:
            if not g.asked.done():
                g.asked.set_exception(LighthouseUnavailable("the coordinator is shutting down"))
        for futures in self._beats.values():
            for f in futures:
                if not f.done():
                    f.set_exception(LighthouseUnavailable("the coordinator is shutting down"))
        self._beats.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._http is not None:
            await self._http.aclose()

    # -- quorum ----------------------------------------------------------------------------------

    async def quorum(self, member: QuorumMember, timeout_s: float) -> Quorum:
        """The quorum that takes ``member`` in, within ``timeout_s`` (TimeoutError after it),
        from this coordinator if it leads, else from the leader through it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        failure = "no coordinator leads"
        while True:
            if self.leading():
                try:
                    return await self._quorum_here(member, deadline)
                except HostUnavailable as exc:
                    if exc.code != NOT_LEADER:
                        raise LighthouseUnavailable(exc.detail) from None
                    failure = exc.detail
            elif (leader := self.host.role.leader) is not None:
                try:
                    return await self._forward_quorum(leader, member, deadline)
                except LighthouseUnavailable as exc:
                    failure = str(exc)
            if loop.time() >= deadline:
                raise TimeoutError(f"no quorum within {timeout_s:.3f} s: {failure}")
            await asyncio.sleep(min(RETRY_S, max(0.0, deadline - loop.time())))

    async def _quorum_here(self, member: QuorumMember, deadline: float) -> Quorum:
        await self._configure()
        rid = member.replica_id
        waiter = _Waiter(rid)
        self._waiters.setdefault(rid, []).append(waiter)
        loop = asyncio.get_running_loop()
        asked = self._gather(member)
        try:
            outcome = await asked
            if isinstance(outcome, Refusal):
                raise LighthouseRefused(outcome.code, outcome.detail)
            assert isinstance(outcome, Appended)
            waiter.appended(outcome.offset)
            while not waiter.future.done():
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait({waiter.future}, timeout=min(LEAD_CHECK_S, left))
                if not waiter.future.done() and not self.leading():
                    # deposed while waiting: the request is in the log, but this coordinator
                    # decides nothing more; ask again wherever the lead is now
                    raise HostUnavailable(NOT_LEADER, "this coordinator stopped leading")
            return waiter.future.result()
        except (TimeoutError, asyncio.CancelledError):
            if waiter.offset is not None and not waiter.future.done():
                self._withdraw(rid, waiter.offset)
            self._gathered = [g for g in self._gathered if g.asked is not asked]
            raise
        finally:
            waiters = self._waiters.get(rid, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(rid, None)

    def _gather(self, member: QuorumMember) -> asyncio.Future[Outcome]:
        """Append ``member``'s request: the future of its outcome.

        A fast quorum is decided at the request of the last of its members to ask, and not
        before, so the requests of the members that ask first can wait for it without
        delaying anyone's answer: they wait here while the fold says that changes no decision
        (``Lighthouse.gather_until``: a member of the last quorum that still heartbeats has not
        asked, they decide no quorum by themselves, and no timeout runs out meanwhile), at most
        :data:`GATHER_TICKS` ticks of the rule. The request that completes the set is appended
        with them, in one batch: one fsync per quorum instead of one per member. Nothing is
        decided from a request still waiting here, and its caller is answered only from the
        log, as every caller is."""
        loop = asyncio.get_running_loop()
        asked: asyncio.Future[Outcome] = loop.create_future()
        record = NewRecord(kind=REQUEST, group=None, payload=msgspec.to_builtins(member))
        self._gathered.append(_Gathered(member, record, asked))
        fold = self.fold
        now = time.time_ns()
        # no settings in the log: the fold refuses the request, at once
        until = (
            None
            if fold.settings is None
            else fold.gather_until(
                now,
                [g.member for g in self._gathered],
                GATHER_TICKS * fold.settings.quorum_tick_ms * 1_000_000,
            )
        )
        if until is None:
            self._append_gathered()
            return asked
        at = loop.time() + (until - now) / 1e9
        if self._gather_due is None or at < self._gather_due.when():
            if self._gather_due is not None:
                self._gather_due.cancel()
            self._gather_due = loop.call_at(at, self._append_gathered)
        return asked

    def _append_gathered(self) -> None:
        """Hand the gathered requests to the host, in one submission (one batch, one append);
        each caller gets its own outcome."""
        if self._gather_due is not None:
            self._gather_due.cancel()
            self._gather_due = None
        gathered = [g for g in self._gathered if not g.asked.done()]
        self._gathered = []
        if not gathered:
            return
        try:
            outcomes = self.host.enqueue_many([g.record for g in gathered], normalized=True)
        except HostUnavailable as exc:
            for g in gathered:
                g.asked.set_exception(exc)
            return
        outcomes.add_done_callback(lambda done: self._hand_out(gathered, done))

    def _hand_out(self, gathered: list[_Gathered], done: asyncio.Future[list[Outcome]]) -> None:
        failed = done.exception() if not done.cancelled() else asyncio.CancelledError()
        for at, g in enumerate(gathered):
            if failed is not None:
                if not g.asked.done():
                    g.asked.set_exception(failed)
                continue
            outcome = done.result()[at]
            if not g.asked.done():
                g.asked.set_result(outcome)
            elif isinstance(outcome, Appended):
                # its caller went away while the request was on its way: it asks no more
                self._withdraw(g.member.replica_id, outcome.offset)

    def _heard(self, effect: Any) -> None:
        if not isinstance(effect, QuorumDecided):
            return
        quorum = quorum_of(effect)
        for member, request in zip(effect.participants, effect.requests, strict=True):
            for waiter in self._waiters.get(member.replica_id, ()):
                waiter.heard(request, quorum)

    def _withdraw(self, rid: str, offset: int) -> None:
        """The call that made request ``offset`` ends unanswered: say so in the log, if the
        request still waits there."""
        pending = self.fold.requests.get(rid)
        if pending is None or pending.offset != offset or not self.leading():
            return
        record = NewRecord(
            kind=WITHDRAWN, group=None, payload={"replica_id": rid, "request": offset}
        )
        self._spawn(self._quietly(self.host.submit(record)))

    async def _configure(self) -> None:
        """Append this coordinator's settings before its first call, if the log holds others."""
        if self.settings is None or self.fold.settings == self.settings:
            return
        async with self._configuring:
            if self.fold.settings == self.settings:
                return
            outcome = await self.host.submit(
                NewRecord(kind=CONFIGURED, group=None, payload=msgspec.to_builtins(self.settings))
            )
            if isinstance(outcome, Refusal):
                raise LighthouseRefused(outcome.code, outcome.detail)

    # -- heartbeats ------------------------------------------------------------------------------

    async def heartbeat(self, replica_ids: list[str]) -> None:
        """The replica groups are alive: answered once their shared record is durable (or the
        leader has it). Raises :class:`LighthouseRefused` for an incarnation reported lost."""
        for rid in replica_ids:
            offset = self.fold.lost_at(rid)
            if offset is not None:
                raise LighthouseRefused(
                    REPLICA_LOST,
                    f"replica {rid!r} was reported lost at offset {offset}; a restarted "
                    "replica group asks under a new id",
                )
        loop = asyncio.get_running_loop()
        futures = []
        for rid in replica_ids:
            future: asyncio.Future[None] = loop.create_future()
            self._beats.setdefault(rid, []).append(future)
            futures.append(future)
        if self._flush is None:
            self._flush = loop.call_later(self._flush_s(), self._start_flush)
        await asyncio.gather(*futures)

    def _flush_s(self) -> float:
        settings = self.fold.settings or self.settings
        if settings is None:
            return self.flush_s
        return min(self.flush_s, settings.heartbeat_timeout_ms / 1000 * FLUSH_SHARE)

    def _start_flush(self) -> None:
        self._flush = None
        beats, self._beats = self._beats, {}
        if beats:
            self._spawn(self._flush_beats(beats))

    async def _flush_beats(self, beats: dict[str, list[asyncio.Future[None]]]) -> None:
        ids = sorted(beats)
        error: BaseException | None = None
        try:
            if self.leading():
                await self._configure()
                fold = self.fold
                ids = [r for r in ids if fold.lost_at(r) is None]
                if ids:
                    outcome = await self.host.submit(
                        NewRecord(kind=HEARTBEAT, group=None, payload={"replicas": ids})
                    )
                    if isinstance(outcome, Refusal):
                        error = LighthouseRefused(outcome.code, outcome.detail)
            elif (leader := self.host.role.leader) is not None:
                await self._forward("/lighthouse/heartbeats", leader, {"replicas": ids}, 5.0)
            else:
                error = LighthouseUnavailable("no coordinator leads")
        except HostUnavailable as exc:
            error = LighthouseUnavailable(exc.detail)
        except (LighthouseRefused, LighthouseUnavailable) as exc:
            error = exc
        for futures in beats.values():
            for f in futures:
                if f.done():
                    continue
                if error is None:
                    f.set_result(None)
                else:
                    f.set_exception(error)

    # -- a launcher's report ---------------------------------------------------------------------

    async def lost(self, replica: str, reason: str) -> int:
        """A launcher saw replica group ``replica`` die: its offset in the log. Only the leader
        appends it (a standby's caller is told ``not_leader``, as for every write)."""
        await self._configure()
        # the requests gathered for a fast quorum that the lost group was part of: it will
        # not ask, so they go first, in the same batch
        self._append_gathered()
        outcome = await self.host.submit(
            NewRecord(kind=LOST, group=None, payload={"replica": replica, "reason": reason})
        )
        if isinstance(outcome, Refusal):
            raise LighthouseRefused(outcome.code, outcome.detail)
        assert isinstance(outcome, Appended | Existing)
        return outcome.offset if isinstance(outcome, Appended) else outcome.id

    # -- to the leader ---------------------------------------------------------------------------

    async def _forward_quorum(self, leader: str, member: QuorumMember, deadline: float) -> Quorum:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise LighthouseUnavailable("the deadline passed")
        body = {"member": msgspec.to_builtins(member), "timeout_s": left}
        answer = await self._forward("/lighthouse/quorum", leader, body, left + 1.0)
        return msgspec.convert(answer, Quorum)

    async def _forward(self, path: str, leader: str, body: Any, timeout_s: float) -> Any:
        """POST ``body`` to the leader; its JSON answer. A refusal raises
        :class:`LighthouseRefused`; anything that another try may cure (the leader gone, a
        standby, a timeout) :class:`LighthouseUnavailable`."""
        import httpx

        if self._http is None:
            headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
            self._http = httpx.AsyncClient(headers=headers)
        try:
            response = await self._http.post(
                leader.rstrip("/") + path, json=body, timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise LighthouseUnavailable(f"the leader {leader} did not answer: {exc!r}") from None
        if response.status_code == 200:
            return response.json()
        try:
            error = response.json()
            code, detail = error.get("error", "http_error"), error.get("detail", response.text)
        except ValueError:
            code, detail = "http_error", response.text
        if response.status_code >= 500 or response.status_code == 504:
            raise LighthouseUnavailable(f"the leader {leader} answered {code}: {detail}")
        raise LighthouseRefused(code, detail)

    # -- chores ----------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quietly(coro: Any) -> None:
        with contextlib.suppress(Exception):
            await coro


_hosts: weakref.WeakKeyDictionary[Host, LighthouseHost] = weakref.WeakKeyDictionary()


def serve_lighthouse(host: Host, settings: Settings | None, **options: Any) -> LighthouseHost:
    """The lighthouse of ``host`` (made once, with the serving coordinator's settings)."""
    lighthouse = _hosts.get(host)
    if lighthouse is None:
        lighthouse = _hosts[host] = LighthouseHost(host, settings, **options)
    return lighthouse


def lighthouse_of(host: Host) -> LighthouseHost:
    """The lighthouse of ``host``, as ``serve`` made it, else one that serves with the
    settings the log holds (a leader that a standby carries calls to)."""
    return _hosts.get(host) or serve_lighthouse(host, None)
