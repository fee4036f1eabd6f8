"""One committed view as this rank sees it: its members, its backend, and its failure.

Rules:
- The backend is built eagerly, in a thread of its own, as soon as the view is installed; the
  first operation waits for it. Building never blocks ``install_view``, and a view superseded
  while its backend is still rendezvousing is abandoned without waiting (the late backend is
  buried when its constructor returns).
- A view fails once, and for good: the first failure (an operation's error, a deadline, a
  failed build, an injected link failure, or a poison notice from another member) wakes every
  operation in flight, and every later operation on the view fails at once with the same hint.
  The next committed view brings a new backend; nothing here changes membership.
- The hint is decided off the caller's thread: a local failure first poisons every member's
  ``fail/<v>/<rank>`` key (so they fail fast too), then the liveness counters say which peers are
  dead. The hint is the union of those and the ranks blamed directly; it never names this rank.
- A view this rank moved on from (a newer one is installed) may still have operations of this
  rank in flight, issued before the move (an operation issued later pinned to it fails at once:
  the rank leaves the view). Its poison key then belongs to the watcher of the new view, so a
  thread of the old view waits on ``poisoned/<v>``, which every poisoner also writes, for as
  long as such operations run: they fail fast too, instead of waiting out their deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from torch.distributed import DistStoreError, PrefixStore, Store

from agent.dataplane import keys
from agent.dataplane.backend import BackendKind
from agent.dataplane.liveness import find_dead
from agent.dataplane.poison import PoisonNotice

log = logging.getLogger(__name__)

# How often the watch of a view this rank moved on from looks whether its operations there ended.
RETIRED_WATCH_SLICE_S = 0.5


class ViewContext(Protocol):
    """What a view needs from the data plane that owns it."""

    rank: int
    incarnation: str
    kind: BackendKind
    liveness_period_s: float
    liveness_window_periods: int

    @property
    def backend_timeout_s(self) -> float: ...

    def control_store(self) -> Store: ...

    def rendezvous_store(self) -> AbstractContextManager[Store]: ...

    def report_links(
        self,
        version: int,
        peers: dict[int, str],
        failed: list[int],
        ops: tuple[int, int] | None = None,
    ) -> None: ...


class Waiter(Protocol):
    """What a view needs of an operation in flight on it (``agent.dataplane.work.Work``): a way
    to wake it when the view fails or the data plane closes."""

    def wake(self) -> None: ...


@dataclass(frozen=True)
class Failure:
    """Why view ``version`` failed on this rank, and who was blamed before liveness was read."""

    reason: str
    blamed: tuple[int, ...]
    notice: PoisonNotice | None  # None: this rank saw the failure first
    report: bool = True  # False: not a link failure (this rank left the view), no evidence
    #: operations this rank had issued on the view, and completed successfully, when it failed
    ops: tuple[int, int] = (0, 0)


class ViewGroup:
    """View ``version`` over ``members`` (sorted global ranks), from ``ctx.rank``'s side."""

    def __init__(self, version: int, members: tuple[int, ...], ctx: ViewContext) -> None:
        self.version = version
        self.members = members
        self.active = ctx.rank in members
        self._ctx = ctx
        self._index = {rank: i for i, rank in enumerate(members)}
        self._cond = threading.Condition()
        self._backend: object | None = None
        self._built = False
        self._retired = False
        self._failure: Failure | None = None
        self._failed_ranks: tuple[int, ...] | None = None
        self._decided = threading.Event()
        self._pending: set[Waiter] = set()
        self._inflight = 0  # operations the backend has not finished, waited on or not
        self._issued = 0  # operations started in the backend
        self._completed = 0  # ... and ended successfully
        self._orphan: object | None = None  # a retired backend, released once it is idle
        self._retired_watch = False  # a thread waits on ``poisoned/<v>`` for the ops left here

    # -- queries ------------------------------------------------------------------------------

    def index(self, rank: int) -> int:
        """``rank``'s position in this view (its rank inside the view's backend)."""
        return self._index[rank]

    @property
    def failure(self) -> Failure | None:
        return self._failure

    def failed_ranks(self, timeout: float | None = None) -> tuple[int, ...]:
        """The decided hint of a failed view; waits for the liveness decision."""
        if self._failure is None:
            raise RuntimeError(f"view {self.version} has not failed")
        if not self._decided.wait(timeout):
            raise TimeoutError(
                f"the hint of view {self.version} was not decided within {timeout} s"
            )
        assert self._failed_ranks is not None
        return self._failed_ranks

    # -- the backend --------------------------------------------------------------------------

    def start(self) -> None:
        """Build this rank's backend for the view in the background (only if this rank is active)."""
        if self.active:
            for target, what in ((self._build, "build"), (self._watch_build, "build-watch")):
                name = f"dataplane-{what}-v{self.version}"
                threading.Thread(target=target, name=name, daemon=True).start()

    def _build(self) -> None:
        ctx = self._ctx
        try:
            ctx.control_store().set(keys.member(self.version, ctx.rank), ctx.incarnation)
            with ctx.rendezvous_store() as store:
                backend = ctx.kind.create(
                    PrefixStore(keys.rendezvous_prefix(self.version), store),
                    self.index(ctx.rank),
                    len(self.members),
                    ctx.backend_timeout_s,
                )
        except RuntimeError as e:
            with self._cond:
                superseded = self._retired
            if not superseded:
                self.fail(f"building the {ctx.kind.name} group of view {self.version} failed: {e}")
            return
        with self._cond:
            keep = not self._retired
            if keep:
                self._backend, self._built = backend, True
                self._cond.notify_all()
            failed = self._failure is not None
        if not keep:
            ctx.kind.abandon(backend)
        elif not failed:  # a view that failed meanwhile has already reported its down evidence
            peers = {m: "up" for m in self.members if m != ctx.rank}
            ctx.report_links(self.version, peers, [])

    def _watch_build(self) -> None:
        """While the backend is not built, look for members that died: fail the view early.

        A member that died after the view was committed never arrives at the rendezvous; without
        this, every member would wait out the backend timeout. Costs nothing when the build is
        quick: the first look happens one liveness window after the build started.
        """
        ctx = self._ctx
        window = ctx.liveness_period_s * ctx.liveness_window_periods
        others = [m for m in self.members if m != ctx.rank]
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._built or self._failure or self._retired, window)
                if self._built or self._failure is not None or self._retired:
                    return
            try:
                dead = find_dead(
                    ctx.control_store(),
                    self.version,
                    others,
                    period=ctx.liveness_period_s,
                    window_periods=ctx.liveness_window_periods,
                    unregistered_are_dead=False,  # it may not have started yet
                )
            except RuntimeError as e:
                log.warning(
                    "rank %d: cannot read liveness for view %d: %s", ctx.rank, self.version, e
                )
                continue
            with self._cond:
                if self._built or self._retired:
                    return
            if dead:
                self.fail(
                    f"rank(s) {dead} died before the group of view {self.version} was built",
                    tuple(dead),
                )
                return

    def backend(self, deadline: float) -> object | None:
        """The built backend, or None if the view has failed or was retired (superseded).

        Past ``deadline`` (a ``time.monotonic()`` value) the view fails: a member never came.
        """
        backend = self._backend
        if backend is not None and self._failure is None:
            return backend  # the fast path of every operation but a view's first
        with self._cond:
            while not self._built and self._failure is None and not self._retired:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._backend is not None and self._failure is None:
                return self._backend
            timed_out = self._failure is None and not self._retired
        if timed_out:
            self.fail(
                f"the group of view {self.version} was not built before the operation's deadline"
            )
        return None

    # -- operations in flight -----------------------------------------------------------------

    def register(self, work: Waiter) -> bool:
        """Track ``work`` so that a failure wakes it; False if the view has already failed."""
        with self._cond:
            if self._failure is not None:
                return False
            self._pending.add(work)
            return True

    def unregister(self, work: Waiter) -> None:
        with self._cond:
            self._pending.discard(work)

    def op_started(self) -> None:
        with self._cond:
            self._inflight += 1
            self._issued += 1
            watch = self._needs_retired_watch()
        if watch:
            self._start_retired_watch()

    def op_ended(self, ok: bool = False) -> None:
        """An operation ended in the backend (``ok``: successfully); a retired backend is
        released once none is left.

        Destroying a gloo backend waits for its operations while holding the GIL (the whole
        process stalls), so a backend is released only when it is idle.
        """
        with self._cond:
            self._inflight -= 1
            self._completed += ok
            orphan = self._orphan if self._inflight == 0 else None
            if orphan is not None:
                self._orphan = None
            if self._inflight == 0:
                self._cond.notify_all()
        if orphan is not None:
            self._ctx.kind.abandon(orphan)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no operation of this rank runs in the view's backend; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._inflight == 0, timeout)

    # -- failure ------------------------------------------------------------------------------

    def fail(
        self,
        reason: str,
        blamed: tuple[int, ...] = (),
        notice: PoisonNotice | None = None,
        *,
        report: bool = True,
    ) -> None:
        """Fail the view (idempotent): wake every operation in flight, then decide the hint.

        ``report=False``: this rank gave the view up (it moved to a newer one while members may
        still run on this one); the members are poisoned as for any failure, but no link
        evidence goes to the agent (no link broke).
        """
        with self._cond:
            if self._failure is not None:
                return
            ops = (self._issued, self._completed)
            self._failure = Failure(reason, blamed, notice, report, ops)
            pending, self._pending = self._pending, set()
            self._cond.notify_all()
        level = logging.WARNING if report else logging.INFO
        log.log(level, "rank %d: view %d failed: %s", self._ctx.rank, self.version, reason)
        for work in pending:
            work.wake()
        threading.Thread(
            target=self._decide, name=f"dataplane-hint-v{self.version}", daemon=True
        ).start()

    def fail_from(self, notice: PoisonNotice) -> None:
        """Another member poisoned the view: fail fast, blaming whom the notice tells us to."""
        self.fail(
            f"rank {notice.by} poisoned view {self.version}: {notice.reason}",
            notice.blamed_by(self._ctx.rank),
            notice,
            report=not notice.left,
        )

    def _decide(self) -> None:
        ctx, failure = self._ctx, self._failure
        assert failure is not None
        store = ctx.control_store()
        others = [m for m in self.members if m != ctx.rank]
        dead: list[int] = []
        try:
            if failure.notice is None:
                notice = PoisonNotice(
                    self.version, ctx.rank, failure.blamed, failure.reason, not failure.report
                ).encode()
                for member in self.members:  # this rank too: it frees our own watcher
                    store.set(keys.fail(self.version, member), notice)
                store.set(keys.poisoned(self.version), notice)  # for members that moved on
            dead = find_dead(
                store,
                self.version,
                others,
                period=ctx.liveness_period_s,
                window_periods=ctx.liveness_window_periods,
            )
        except RuntimeError as e:  # the store is unreachable: blame only what we saw ourselves
            log.error("rank %d: cannot read liveness for view %d: %s", ctx.rank, self.version, e)
        failed = sorted((set(failure.blamed) | set(dead)) - {ctx.rank})
        self._failed_ranks = tuple(failed)
        self._decided.set()
        if failure.report:
            ctx.report_links(self.version, {r: "down" for r in failed}, failed, failure.ops)

    def leave(self, reason: str) -> None:
        """This rank gives the view up while members may still run on it: poison it, no evidence.

        Idempotent, and a no-op on a view that already failed.
        """
        self.fail(reason, report=False)

    def inject_link_failure(self, peer: int) -> None:
        """Fail the view as if the link to ``peer`` broke (fault injection for tests and drills)."""
        self.fail(f"injected link failure between rank {self._ctx.rank} and rank {peer}", (peer,))

    def retire(self, *, wake: bool = False) -> None:
        """A newer view superseded this one: abandon its backend, free this rank's watcher.

        Operations still in flight keep running (peers that have not moved on may finish them);
        ``wake``: wake each of them, the data plane is closing.
        """
        with self._cond:
            if self._retired:
                return
            self._retired = True
            backend, self._backend = self._backend, None  # the reaper must hold the last reference
            if backend is not None and self._inflight > 0:
                self._orphan, backend = backend, None  # released by the last op_ended()
            watched = self.active
            pending = list(self._pending) if wake else []
            watch = not wake and self._needs_retired_watch()
            self._cond.notify_all()
        if watch:
            self._start_retired_watch()
        if watched:
            try:
                self._ctx.control_store().set(keys.fail(self.version, self._ctx.rank), keys.RETIRED)
            except RuntimeError as e:
                log.warning(
                    "rank %d: cannot retire view %d in the store: %s",
                    self._ctx.rank,
                    self.version,
                    e,
                )
        self._ctx.kind.abandon(backend)
        for work in pending:
            work.wake()

    # -- operations left on a view this rank moved on from ------------------------------------

    def _needs_retired_watch(self) -> bool:
        """Under ``_cond``: True if a watch must start now (and it is marked as started)."""
        if (
            not self._retired
            or not self.active
            or self._failure is not None
            or self._inflight == 0
            or self._retired_watch
        ):
            return False
        self._retired_watch = True
        return True

    def _start_retired_watch(self) -> None:
        threading.Thread(
            target=self._watch_retired,
            name=f"dataplane-retired-watch-v{self.version}",
            daemon=True,
        ).start()

    def _watch_retired(self) -> None:
        """Wait on ``poisoned/<v>`` while this rank still has operations in flight on the view:
        a member that has not moved on poisons it when its own operation fails, and the
        operations here fail from that notice. Leaves once none is in flight (looking every
        ``RETIRED_WATCH_SLICE_S``), or once the view failed."""
        key = keys.poisoned(self.version)
        slice_ = timedelta(seconds=RETIRED_WATCH_SLICE_S)
        raw: bytes | None = None
        try:
            with self._ctx.rendezvous_store() as store:
                while raw is None:
                    with self._cond:
                        if self._failure is not None or self._inflight == 0:
                            self._retired_watch = False
                            return
                    try:
                        store.wait([key], slice_)
                    except DistStoreError:  # this slice timed out: look again
                        continue
                    raw = store.get(key)
        except RuntimeError as e:  # the store is down or moved: the deadline still ends the ops
            log.warning(
                "rank %d: cannot watch view %d it moved on from: %s",
                self._ctx.rank,
                self.version,
                e,
            )
            with self._cond:
                self._retired_watch = False
            return
        self.fail_from(PoisonNotice.read(self.version, raw))
