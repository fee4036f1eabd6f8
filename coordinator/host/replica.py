"""Several coordinators on one PostgreSQL log: a standby until the lease is won, then the leader.

::

                       the lease is free: claim it, claim_term(), catch up
       +-----------+ ---------------------------------------------------> +----------+
       |  STANDBY  |                                                      |  LEADER  |
       +-----------+ <--------------------------------------------------- +----------+
       tails the log and folds it     lease lost or run out, or an append   appends, steps
       (warm); answers reads;         fenced (StaleTermError): step down    the fold, writes
       writes get 503 not_leader                                            projections,
       naming the leader                                                    renews the lease

Rules, and why:

- **Only the leader writes**: records, projections and snapshots. A standby folds exactly what
  the leader appended, so its fold, journals and answers are the leader's, a little later. The
  projection rows it derives are kept until the leader's stored consumer offset shows them
  written, so a leader that died between its append and its projection write leaves no hole.
- **Promotion order**: win the lease, ``claim_term()`` (it waits for an append of the old term in
  flight and fences every later one), record the term in the lease, fold the rest of the log,
  write the pending projections, and only then take inputs. Nothing is answered from a fold
  that has not seen every record of the previous term.
- **Stepping down** happens at once when a renewal finds another generation (this process was
  paused or slow past its lease and a standby took over), when the database could not be
  reached for a whole lease (by the local monotonic clock), or when an append raised
  StaleTermError. Queued inputs, waiting proposals and long polls get ``503 not_leader``; the
  batch in flight finishes (its append either commits under a still-current term or is fenced);
  then the host follows the log again as a standby. It does not exit: a deposed leader is a
  warm standby.
- A SQLite log has one coordinator: :func:`open_host` opens it as a :class:`Host` whose role is
  ``SoleLeader``.

The standby's differences are the host's :class:`Replica` role (``coordinator.host.loop.Role``): it
starts the host's loop on promotion and stops it on stepping down, through the host's public
methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from ...eventlog import LogError, open_log
from ...eventlog.failpoints import stop_point
from ...eventlog.postgres import PostgresLog
from ...eventlog.target import PostgresTarget, parse_target
from ...wire.codes import FOLD_FAILED, NOT_LEADER
from .inputs import HostUnavailable
from .leadership import Lease, LeaseError, LeaseSettings
from .loop import Host

log = logging.getLogger("foldplane.replica")


class NotLeader(HostUnavailable):
    """``503 not_leader``: this coordinator does not lead; ``leader`` names the one that does."""

    def __init__(self, leader: str | None, why: str) -> None:
        where = f"; the leader is {leader}" if leader else "; no leader is known right now"
        super().__init__(NOT_LEADER, f"this coordinator is a standby ({why}){where}")
        self.leader = leader


async def open_host(
    target: str, *, address: str, settings: LeaseSettings | None = None, **options: Any
) -> Host:
    """Open and start the coordinator for ``target``.

    A PostgreSQL log gets a host with the :class:`Replica` role, which starts as a standby and
    leads once it wins the lease; a SQLite log gets the sole leader (which claims the term).
    """
    where = parse_target(target)
    if not isinstance(where, PostgresTarget):
        return await Host.open(target, **options)
    host = await open_replica(
        target, address=address, settings=settings or LeaseSettings(), **options
    )
    host.start()
    # Serve once the first lease round is known, so /healthz names the leader from the start.
    replica = Replica.of(host)
    await replica.first_round()
    return host


async def open_replica(
    target: str,
    *,
    address: str,
    settings: LeaseSettings,
    adopt_empty: bool = False,
    **options: Any,
) -> Host:
    """Open the log (no term claimed), restore the snapshot and fold the tail as a standby."""
    where = parse_target(target)
    if not isinstance(where, PostgresTarget):
        raise ValueError(f"{where.describe()} has one coordinator; standbys need a PostgreSQL log")
    log_ = await open_log(target)
    try:
        lease = Lease(where, f"{address}#{uuid.uuid4().hex[:12]}", address, settings)
        return await Host.restore(log_, role=Replica(lease), **options)
    except BaseException:
        await log_.close()
        raise


class Replica:
    """The role of a coordinator that leads only while it holds the lease; see the module
    docstring."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.liveness_s: float | None = lease.settings.lease_s
        self.name = "standby"
        #: The leader's address as the lease row last named it (ours while we lead).
        self.leader: str | None = None
        #: How often this coordinator became the leader, and stepped down.
        self.promotions = 0
        self.demotions = 0
        self._host: Host | None = None
        self._generation: int | None = None
        self._roles: asyncio.Task[None] | None = None
        self._first_round = asyncio.Event()

    @staticmethod
    def of(host: Host) -> Replica:
        """The replica role of ``host`` (a host opened with :func:`open_replica`)."""
        role = host.role
        if not isinstance(role, Replica):
            raise TypeError(f"the host's role is {type(role).__name__}; open it with open_replica")
        return role

    @property
    def host(self) -> Host:
        assert self._host is not None, "the role is attached to its host when the host is built"
        return self._host

    # -- the role's interface (coordinator.host.loop.Role) -------------------------------------

    def attach(self, host: Host) -> None:
        # A standby writes no projection rows: it holds the ones it derives (see the rules).
        self._host = host
        host.projections.hold()
        host.set_unavailable(NotLeader(None, "starting"))

    def start(self) -> None:
        """Start the role loop; the host's own loop and ticker start on promotion."""
        self._roles = asyncio.get_running_loop().create_task(self._run_roles())

    def check_polls(self, why: str) -> None:
        """Long polls go to the leader: a standby (or a leader that stepped down while the rank
        waited) answers ``not_leader`` so the agent moves on instead of polling a follower."""
        down = self.host.available()
        if self.name != "leader" or down is not None:
            raise down or NotLeader(self.leader, why)

    async def stop(self) -> None:
        """Stop following or leading (a leader snapshots as the host closes)."""
        if self._roles is not None:
            self._roles.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._roles

    async def closed(self) -> None:
        """Release the lease at once, so a standby need not wait for it to run out."""
        await self._release()
        await self.lease.close()

    async def first_round(self) -> None:
        """Wait until the first claim of the lease has an answer (won, lost to a named leader,
        or the lease unreachable), or the role loop ended."""
        assert self._roles is not None, "start the host first"
        waiter = asyncio.ensure_future(self._first_round.wait())
        try:
            await asyncio.wait({waiter, self._roles}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    # -- the roles -----------------------------------------------------------------------------

    async def _run_roles(self) -> None:
        try:
            while True:
                try:
                    state = await self.lease.try_claim()
                except LeaseError as exc:
                    log.warning("cannot reach the lease: %s", exc)
                else:
                    if state.won is not None:
                        self._first_round.set()
                        await self._lead(state.won)
                        continue
                    self._learn_leader(state.leader)
                self._first_round.set()
                await self._follow_for(self.lease.settings.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A fold that fails cannot be trusted to lead; stay up so /healthz says why.
            log.exception("the coordinator stops following the log")
            down = self.host.available()
            if down is None or down.code == NOT_LEADER:
                self.host.set_unavailable(HostUnavailable(FOLD_FAILED, f"following failed: {exc}"))
            self.name = "standby"

    def _learn_leader(self, leader: str | None) -> None:
        if self.name != "standby":
            return
        current = self.host.available()
        if current is not None and current.code != NOT_LEADER:
            return  # a worse condition (fold_failed) is not hidden by a leader change
        if leader != self.leader or getattr(current, "leader", None) != leader:
            self.leader = leader
            self.host.set_unavailable(NotLeader(leader, "following the log"))

    async def _follow_for(self, seconds: float) -> None:
        """Fold what the leader appends, as it appends it, for ``seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        host = self.host
        while (remaining := deadline - loop.time()) > 0:
            try:
                await host.log.wait(host.machine.offset, timeout=remaining)
                await host.catch_up()
                await host.projections.settle(host.machine.offset)
            except LogError as exc:
                log.warning("cannot follow the log: %s", exc)
                await asyncio.sleep(max(0.0, deadline - loop.time()))

    async def _lead(self, generation: int) -> None:
        """Won the lease: take the term, catch up, serve; step down when the lease is lost."""
        loop = asyncio.get_running_loop()
        settings = self.lease.settings
        self._generation = generation
        try:
            stop_point("claim")
            term = await self._claim_term(generation)
            confirmed_at = loop.time()
            confirmed = await self.lease.renew(generation, term)
        except (LogError, LeaseError) as exc:
            log.error("won the lease but could not take the term: %s", exc)
            await self._release()
            return
        if not confirmed:
            log.warning("the lease was lost while taking term %d", term)
            self._generation = None
            return
        try:
            await self._promote()
        except (LogError, ValueError) as exc:  # ValueError: the stored consumer offset moved
            log.error("cannot catch up with the log at term %d: %s", term, exc)
            await self._step_down(f"catching up failed: {exc}")
            return
        reason = await self._hold(generation, confirmed_at + settings.lease_s)
        await self._step_down(reason)

    async def _claim_term(self, generation: int) -> int:
        """Take the log's term, only while the lease is still ours (a PostgreSQL log): a
        coordinator paused between winning the lease and this claim, whose lease ran out
        meanwhile, must not fence the leader elected after it."""
        log_ = self.host.log
        if isinstance(log_, PostgresLog):
            return await log_.claim_term_under_lease(self.lease.holder, generation)
        return await log_.claim_term()

    async def _promote(self) -> None:
        # Every record of the previous term first (nobody else appends now), still as a
        # standby; then every row derived from them that the previous leader may not have
        # written; only then take inputs, so nothing is answered from a fold that lags.
        host = self.host
        await host.catch_up()
        await host.projections.write_held(host.machine.offset)
        self.name = "leader"
        self.leader = self.lease.address
        host.set_unavailable(None)
        self.promotions += 1
        host.serve()
        log.warning(
            "leading at term %d from offset %d (%s)",
            host.log.term,
            host.machine.offset,
            self.lease.address,
        )

    async def _hold(self, generation: int, valid_until: float) -> str:
        """Renew the lease every ``renew_s`` until it is lost; return why it was.

        The database decides: a renewal of our generation that succeeds keeps us leading even
        if it came late (nobody claimed in between), and one that finds another generation ends
        it. Only when the database cannot be reached does the local clock decide: once a lease
        has passed since the last renewal was sent, a standby may lead, so stop answering.
        """
        loop = asyncio.get_running_loop()
        settings = self.lease.settings
        while True:
            await asyncio.sleep(settings.renew_s)
            down = self.host.available()
            if down is not None:
                return f"the host stopped: {down.detail}"
            sent = loop.time()
            try:
                renewed = await self.lease.renew(generation)
            except LeaseError as exc:
                if loop.time() >= valid_until:
                    return (
                        f"no renewal for {loop.time() - valid_until + settings.lease_s:.3f} s, "
                        f"longer than the {settings.lease_s} s lease: {exc}"
                    )
                log.warning(
                    "lease renewal failed (lease valid %.3f s more): %s", valid_until - sent, exc
                )
                continue
            if not renewed:
                return (
                    f"another coordinator claimed the lease after generation {generation} "
                    "(this one was paused or slow past its lease)"
                )
            valid_until = sent + settings.lease_s

    async def _step_down(self, reason: str) -> None:
        host = self.host
        term = host.log.term
        log.warning("stepping down from term %d: %s", term, reason)
        self.name = "standby"
        self.leader = None
        host.projections.hold()  # a standby writes no projection rows
        await host.stop_serving(NotLeader(None, f"stepped down from term {term}: {reason}"))
        self.demotions += 1
        await self._release()

    async def _release(self) -> None:
        generation, self._generation = self._generation, None
        if generation is not None:
            with contextlib.suppress(LeaseError):
                await self.lease.release(generation)
