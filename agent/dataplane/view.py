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
  A failure the hint explains is logged at INFO (the layers above say what the group does
  about it, in a line); one with an empty hint (every member alive) is a warning.
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
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from torch.distributed import PrefixStore, Store

from . import keys
from .backend import (
    BackendKind,
    abort_nccl,
    bury,
    connect_nccl,
    end_gloo_operations,
)
from .errors import DataPlaneError
from .liveness import find_dead
from .persistent import PersistentGloo
from .poison import PoisonNotice

log = logging.getLogger(__name__)

# How often the watch of a view this rank moved on from looks for the view's poison notice.
RETIRED_WATCH_SLICE_S = 0.02


class ViewContext(Protocol):
    """What a view needs from the data plane that owns it."""

    rank: int
    incarnation: str
    kind: BackendKind
    liveness_period_s: float
    liveness_window_periods: int
    #: set once this process ran an operation on a CUDA tensor: later views build NCCL eagerly
    cuda_used: bool
    #: survivors-only views shrink the previous NCCL communicator (NCCL >= 2.27)
    nccl_shrink: bool
    #: how long a failed view's NCCL communicator waits for a shrink before it is aborted
    abort_grace_s: float
    closed: threading.Event

    @property
    def backend_timeout_s(self) -> float: ...

    @property
    def persistent_gloo(self) -> PersistentGloo | None: ...

    #: a group of torch's reconfigure model runs on the plane (it claims reconfigure views)
    configurations: bool

    def park(self, version: int, members: tuple[int, ...], backends: dict[str, object]) -> None: ...

    #: how long an operation may run: a newer view that explains a failure comes within it
    collective_timeout_s: float

    def control_store(self) -> Store: ...

    def wait_for_view(
        self, predicate: Callable[[ViewGroup], bool], timeout: float | None
    ) -> ViewGroup | None: ...

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

    def __init__(
        self,
        version: int,
        members: tuple[int, ...],
        ctx: ViewContext,
        parent: ViewGroup | None = None,
        *,
        ordered: bool = False,
    ) -> None:
        self.version = version
        #: the view's ranks in in-view rank order: global rank order, or a reconfigure's
        #: handle order (``ordered``)
        self.members = members
        #: a reconfigure committed this view: its backends are kept for the group of torch's
        #: model, which takes them (``hand_over``)
        self.ordered = ordered
        self._handed_over = False
        self.active = ctx.rank in members
        self._ctx = ctx
        self._index = {rank: i for i, rank in enumerate(members)}
        self._cond = threading.Condition()
        self._backend: object | None = None  # gloo: CPU tensors
        self._built = False  # every backend built with the view is (gloo, and NCCL if eager)
        #: NCCL: CUDA tensors (a ``"nccl"`` data plane); built with the view once this process
        #: used a CUDA tensor (or from the first view, ``eager_cuda``), else at its first use
        self._cuda: object | None = None
        self._cuda_state = "absent"  # absent | building | built | failed
        self._cuda_connecting: object | None = None  # abortable while it connects
        self._aborted = False
        #: the view this one follows: its NCCL communicator may be shrunk into this one's
        self._parent = parent if parent is not None and parent.active else None
        #: this view's communicator is kept for the next view to shrink (not abandoned yet)
        self._cuda_reserved = False
        self._retired = False
        self._failure: Failure | None = None
        self._failed_ranks: tuple[int, ...] | None = None
        self._decided = threading.Event()
        self._pending: set[Waiter] = set()
        self._inflight = 0  # operations the backend has not finished, waited on or not
        self._issued = 0  # operations started in the backend
        self._completed = 0  # ... and ended successfully
        self._orphan: object | None = None  # a retired backend, released once it is idle
        #: who lent this view its gloo backend (views reconfigure one backend), else None
        self._lender: PersistentGloo | None = None
        self._ending = False  # the lent backend's operations were ended (once)
        self._ending_now = False  # ... and the thread that ends them still runs
        self._retired_watch = False  # a thread waits on ``poisoned/<v>`` for the ops left here
        self._threads: list[threading.Thread] = []  # see wait_threads_left
        self._build_over = False  # the build thread is done: built, failed, released or parked

    # -- queries ------------------------------------------------------------------------------

    def index(self, rank: int) -> int:
        """``rank``'s position in this view (its rank inside the view's backend)."""
        return self._index[rank]

    @property
    def failure(self) -> Failure | None:
        return self._failure

    @property
    def aborted(self) -> bool:
        """True once this rank aborted the view's NCCL communicator (kernels then end early)."""
        return self._aborted

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
        """Build this rank's backend for the view in the background (only if this rank is
        active, and never on a closed data plane: see :meth:`wait_threads_left`)."""
        if not self.active:
            return
        with self._cond:  # both threads, or neither (the lock is reentrant)
            if self._ctx.closed.is_set():  # installed while the plane closed: nothing builds
                self._build_over = True
                self._cond.notify_all()
                return
            for target, what in ((self._build, "build"), (self._watch_build, "build-watch")):
                self._spawn(target, f"dataplane-{what}-v{self.version}")

    def _spawn(self, target: Callable[[], None], name: str, *, unless_closed: bool = False) -> bool:
        """Start ``target`` on a daemon thread of this view, one ``wait_threads_left`` waits
        for; with ``unless_closed``, not once the data plane is closed (False then).

        The check and the start are one step under the view's lock, which ``retire`` (and so
        ``DataPlane.close``) takes before it waits: a thread is either started before the
        close waits, and waited for, or not at all.
        """
        with self._cond:
            if unless_closed and self._ctx.closed.is_set():
                return False
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        return True

    def wait_threads_left(self, timeout: float) -> bool:
        """Wait until every thread of this view (its build, its hint's decision, the end of
        its operations...) has returned from torch and ended; False if ``timeout`` passed
        first.

        A daemon thread still inside a torch call (a store wait, gloo's connect, a backend's
        destructor) when the interpreter shuts down dies when the call returns: Python ends a
        thread that takes the GIL during finalization, and the unwinding through torch's
        binding ends the process (``terminate called without an active exception``, exit -6).
        The members of a view that commits just before they close (the quick start's view 2,
        an HSDP run's last views) build it while they exit; a view installed while the data
        plane closes (the agent's driver thread still running) must build nothing.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:  # a thread may start another (a build that fails the view)
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return True
            for thread in alive:
                thread.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                with self._cond:
                    return not any(t.is_alive() for t in self._threads)

    def threads_alive(self) -> list[str]:
        """The names of this view's threads still running (``wait_threads_left``)."""
        with self._cond:
            return [t.name for t in self._threads if t.is_alive()]

    def _build(self) -> None:
        try:
            self._build_backends()
        finally:
            with self._cond:
                self._build_over = True
                self._cond.notify_all()

    def _build_backends(self) -> None:
        ctx = self._ctx
        cuda = ctx.kind.name == "nccl" and (ctx.kind.eager_cuda or ctx.cuda_used)
        if cuda:
            with self._cond:
                self._cuda_state = "building"
        try:
            ctx.control_store().set(keys.member(self.version, ctx.rank), ctx.incarnation)
            lender = self._lender = ctx.persistent_gloo
            with ctx.rendezvous_store() as store:
                if lender is not None:  # the one gloo backend, reconfigured for this view
                    backend = lender.build(store, self.version, self.members, ctx.backend_timeout_s)
                else:
                    backend = ctx.kind.create_for(  # gloo, for CPU tensors (NCCL comes after)
                        "cpu",
                        PrefixStore(keys.rendezvous_prefix(self.version), store),
                        self.index(ctx.rank),
                        len(self.members),
                        ctx.backend_timeout_s,
                    )
        except RuntimeError as e:
            with self._cond:
                superseded = self._retired
            if not superseded:
                self.fail(f"building the gloo group of view {self.version} failed: {e}")
            return
        with self._cond:
            keep = not self._retired
            if keep:
                self._backend, self._built = backend, not cuda
                self._cond.notify_all()
            failed = self._failure is not None
            # A reconfigure's view retired while it built (the next view, say the other half
            # of a merge, committed first): torch's model still takes this backend, as it takes
            # one of a view retired once built (``retire`` parks that one).
            lender = None
            park = not keep and not cuda and not failed and self._kept_for_configuration()
            if park:
                lender, self._lender = self._lender, None
        if park:
            if lender is not None:
                lender.hand_over(backend)
            ctx.park(self.version, self.members, {"cpu": backend})
            return
        if not keep:
            self._release_gloo(backend)
            return
        if cuda and not self._build_cuda():
            return
        with self._cond:
            self._built = True
            self._cond.notify_all()
            failed = self._failure is not None
        if not failed:  # a view that failed meanwhile has already reported its down evidence
            peers = {m: "up" for m in self.members if m != ctx.rank}
            ctx.report_links(self.version, peers, [])

    def _build_cuda(self) -> bool:
        """Build and connect the view's NCCL communicator (its state is ``building``): shrunk
        from the previous view's, or fresh. True if it is ready. A failure fails the view; a
        retired view abandons what was built."""
        ctx = self._ctx
        how = "shrinking the previous view's NCCL group into"
        try:
            backend = self._shrink_parent()
            if backend is None:
                how = "building the NCCL group of"
                with ctx.rendezvous_store() as store:
                    backend = ctx.kind.create_for(
                        "cuda",
                        PrefixStore(keys.rendezvous_prefix(self.version) + "cuda/", store),
                        self.index(ctx.rank),
                        len(self.members),
                        ctx.backend_timeout_s,
                        connect=False,
                    )
            with self._cond:
                gone = self._retired or self._failure is not None
                if not gone:
                    self._cuda_connecting = backend  # a failure meanwhile aborts it
            if gone:
                ctx.kind.abandon(backend)
                self._set_cuda_state("failed")
                return False
            connect_nccl(backend, ctx.kind.device)
        except RuntimeError as e:
            self._set_cuda_state("failed")
            with self._cond:
                superseded = self._retired
            if not superseded:
                self.fail(f"{how} view {self.version} failed: {e}")
            return False
        with self._cond:
            self._cuda_connecting = None
            keep = not self._retired and self._failure is None
            if keep:
                self._cuda, self._cuda_state = backend, "built"
                self._cond.notify_all()
        if not keep:
            ctx.kind.abandon(backend)
            self._set_cuda_state("failed")
        return keep

    _parent_version: int | None = None

    def _shrink_parent(self) -> object | None:
        """This view's NCCL communicator shrunk from the previous view's, or None (build fresh).

        Only for a view whose members are a strict subset of the previous view's (survivors,
        or a deactivation), when NCCL can shrink (>= 2.27, torch's ``shrink``) and this rank's
        previous communicator is intact (never aborted). Every member must take the same path
        (a shrink waits for all of them), so the first to decide writes the previous view's
        fate with ``compare_set``; a member whose communicator is already aborted decides
        ``abort`` for all, and then every member builds fresh. The shrink aborts whatever was
        still in flight on the previous communicator (``SHRINK_ABORT``): those operations fail.
        """
        with self._cond:
            parent, self._parent = self._parent, None
        ctx = self._ctx
        if parent is None:
            return None
        if not ctx.nccl_shrink or not self.active or not set(self.members) < set(parent.members):
            parent.release_cuda()
            return None
        self._parent_version = parent.version
        fate_key = keys.nccl_fate(parent.version)
        comm = parent.claim_cuda()
        if comm is None or not getattr(comm, "supports_shrinking", False):
            # This member cannot shrink: none may (a shrink waits for every member).
            ctx.control_store().compare_set(fate_key, "", "abort")
            parent.release_cuda()
            return None
        plan = f"shrink:{self.version}"
        fate = ctx.control_store().compare_set(fate_key, "", plan)
        if fate.decode() != plan:
            parent.release_cuda()  # "abort": a member gave its communicator up already
            return None
        excluded = [parent.index(m) for m in parent.members if m not in self.members]
        shrink_abort = 1  # NCCL_SHRINK_ABORT: end what is in flight on the parent first
        log.info(
            "rank %d: view %d shrinks view %d's NCCL group (excluding in-view ranks %s)",
            ctx.rank,
            self.version,
            parent.version,
            excluded,
        )
        parent.mark_aborted()  # before the shrink: its ops in flight end as failures
        try:
            return comm.shrink(excluded, shrink_abort, None)  # type: ignore[attr-defined]
        finally:
            bury(comm)  # aborted by the shrink, never destroyed

    def claim_cuda(self) -> object | None:
        """The next view takes this view's intact NCCL communicator (to shrink it), or None."""
        with self._cond:
            if self._cuda is None or self._aborted:
                return None
            return self._cuda

    def release_cuda(self) -> None:
        """The next view does not shrink this view's communicator: let it go as usual (now if
        nothing runs on it, else when the last operation ends, or aborted if the view fails)."""
        with self._cond:
            self._cuda_reserved = False
            cuda = None
            if self._retired and self._inflight == 0:
                cuda, self._cuda = self._cuda, None
        if cuda is not None:
            self._ctx.kind.abandon(cuda)

    def mark_aborted(self) -> None:
        """The communicator is being shrunk with its ops aborted: they end as failures."""
        with self._cond:
            self._aborted = True
            self._cuda = None
            self._cuda_reserved = False

    def _set_cuda_state(self, state: str) -> None:
        with self._cond:
            self._cuda_state = state
            self._cond.notify_all()

    def _kept_for_configuration(self) -> bool:
        """A reconfigure committed the view and a group of torch's model runs on the plane:
        the view's backends are that group's to take (``hand_over``), or parked for it."""
        return self.ordered and self._ctx.configurations

    def hand_over(self, deadline: float) -> dict[str, object] | None:
        """Give the view's backends (gloo, and NCCL if built with the view) to the group of
        torch's model once built; None if the build failed, the view was retired unclaimed
        meanwhile (then they are parked with the plane: a build still running parks its
        backend when it ends, and this waits for that), or ``deadline`` passed."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._built
                    or self._failure is not None
                    or (self._retired and (self._build_over or not self.active))
                ),
                max(0.0, deadline - time.monotonic()),
            )
            if not self._built or self._failure is not None or self._retired:
                return None
            backends = {"cpu": self._backend}
            if self._cuda is not None and not self._aborted:
                backends["cuda"] = self._cuda
            self._backend = self._cuda = None
            self._handed_over = True
            lender, self._lender = self._lender, None
        if lender is not None:
            lender.hand_over(backends["cpu"])
        return backends

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

    def backend(self, deadline: float, device_type: str = "cpu") -> object | None:
        """The built backend for ``device_type`` tensors, or None if the view has failed or was
        retired (superseded). The first CUDA operation of a process builds the view's NCCL
        communicator if it was not built with the view.

        Past ``deadline`` (a ``time.monotonic()`` value) the view fails: a member never came.
        """
        if self._handed_over:
            raise DataPlaneError(
                f"view {self.version}'s backend belongs to the group of torch's reconfigure "
                "model now (the reconfigure that committed the view took it)"
            )
        if device_type == "cuda":
            return self._cuda_backend(deadline)
        backend = self._backend
        if backend is not None and self._failure is None:
            return backend  # the fast path of every operation but a view's first
        return self._await(deadline, lambda: self._backend is not None, "the group")

    def _cuda_backend(self, deadline: float) -> object | None:
        backend = self._cuda
        if backend is not None and self._failure is None and not self._retired:
            return backend  # (a retired view may keep it for the next view to shrink)
        start = False
        with self._cond:
            if self._cuda_state == "absent" and self._failure is None and not self._retired:
                self._cuda_state, start = "building", True
        if start:  # the first CUDA tensor of this process: build now, and with every later view
            self._ctx.cuda_used = True
            self._spawn(self._build_cuda, f"dataplane-build-cuda-v{self.version}")
        self._await(deadline, lambda: self._cuda_state != "building", "the NCCL group")
        with self._cond:
            return self._cuda if self._failure is None and not self._retired else None

    def _await(self, deadline: float, ready: Callable[[], bool], what: str) -> object | None:
        """Wait until ``ready()`` (under the lock), the view fails or is retired, or
        ``deadline``; past it the view fails (a member never came). The gloo backend, or None."""
        with self._cond:
            while not ready() and self._failure is None and not self._retired:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if ready() and self._failure is None:
                return self._backend
            timed_out = self._failure is None and not self._retired
        if timed_out:
            self.fail(
                f"{what} of view {self.version} was not built before the operation's deadline"
            )
        return None

    def check_liveness(self) -> None:
        """An operation runs long: fail the view if a member stopped heartbeating (it died or
        hangs). Blocks one liveness window."""
        ctx = self._ctx
        others = [m for m in self.members if m != ctx.rank]
        dead = find_dead(
            ctx.control_store(),
            self.version,
            others,
            period=ctx.liveness_period_s,
            window_periods=ctx.liveness_window_periods,
        )
        if dead and self._failure is None:
            self.fail(
                f"rank(s) {dead} stopped while an operation of view {self.version} ran", tuple(dead)
            )

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
            # (while its operations are being ended, the thread that ends them releases it)
            orphan = self._orphan if self._inflight == 0 and not self._ending_now else None
            if orphan is not None:
                self._orphan = None
            cuda = None
            if self._inflight == 0:
                if self._retired and not self._cuda_reserved:
                    cuda, self._cuda = self._cuda, None
                self._cond.notify_all()
        if orphan is not None:
            self._release_gloo(orphan)
        if cuda is not None:
            self._ctx.kind.abandon(cuda)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no operation of this rank runs in the view's backend, and the watch of a
        view this rank moved on from has left; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._inflight == 0 and not self._retired_watch, timeout
            )

    @property
    def busy(self) -> bool:
        """An operation of this rank still runs in the view's backend."""
        return self._inflight > 0

    def end_operations(self) -> None:
        """The data plane is closing: end this rank's operations in flight on the view's gloo
        backend now (they fail; see :func:`agent.dataplane.backend.end_gloo_operations`).

        Not done when the view merely fails: a member whose operation ends by a closed
        connection fails the view on its own account, before the poison notice says whom to
        blame. At close, the process's exit would close the connections anyway.
        """
        with self._cond:
            backend = self._backend if self._backend is not None else self._orphan
            busy = self._inflight > 0 and self.active
        if backend is not None and busy:
            end_gloo_operations(backend, self.index(self._ctx.rank), len(self.members))

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
            ending = self._lent_orphan_to_end()  # this rank moved on already
            self._cond.notify_all()
        self._end_lent_orphan(ending)
        # At INFO: a failure the hint explains (it names the ranks that failed) is the elastic
        # path at work, which the layers above report in a line; ``_decide`` warns of one it
        # cannot explain.
        log.info("rank %d: view %d failed: %s", self._ctx.rank, self.version, reason)
        if self._ctx.nccl_shrink and self._cuda is not None and not self._aborted:
            self._defer_abort()
        else:
            self._abort_cuda()
        for work in pending:
            work.wake()
        if not self._spawn(self._decide, f"dataplane-hint-v{self.version}", unless_closed=True):
            # closed: nobody reads the store for it any more; the hint is what this rank saw
            self._failed_ranks = tuple(sorted(set(blamed) - {self._ctx.rank}))
            self._decided.set()

    def _defer_abort(self) -> None:
        """A failed view's NCCL communicator: give the next view a moment to shrink it, else
        abort it. Its waiters are woken now (their answer is False); its kernels end with the
        shrink or the abort, within ``abort_grace_s``. Every member agrees on which, through
        the view's fate in the store (``abort`` if nobody claimed a shrink in time).
        """

        def later() -> None:
            if self._ctx.closed.wait(self._ctx.abort_grace_s):
                return
            try:
                fate = self._ctx.control_store().compare_set(
                    keys.nccl_fate(self.version), "", "abort"
                )
            except RuntimeError as e:  # the store is gone: nobody can shrink with us either
                log.warning(
                    "rank %d: cannot read view %d's fate: %s", self._ctx.rank, self.version, e
                )
                fate = b"abort"
            if fate == b"abort":
                self._abort_cuda()

        self._spawn(later, f"dataplane-abort-v{self.version}")

    def _abort_cuda(self) -> None:
        """Abort the view's NCCL communicator on this rank (once): its kernels in flight return.

        Every member does the same when the view fails (the poison notice reaches each), so no
        communicator of a failed view is left for another member to wait on; none is destroyed.
        """
        with self._cond:
            if self._aborted:
                return
            backend = self._cuda if self._cuda is not None else self._cuda_connecting
            if backend is None:
                return
            self._aborted = True
        abort_nccl(backend)

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
        if failure.report and not failed:
            self._say_why_alive(failure)  # after the report: it may wait for a newer view
        elif failure.report:
            log.info("rank %d: view %d: failed ranks %s", ctx.rank, self.version, failed)

    def _say_why_alive(self, failure: Failure) -> None:
        """A failure that blames nobody, every member alive: say what happened.

        Most often the group moved on: a member installed a newer view and released this
        one's backend while this rank still ran an operation on it (gloo then says the
        connection was closed by the peer). The newer view reaches this rank too, within an
        operation's deadline: then that is the line, at INFO, in foldplane's words (the raw
        reason is in the INFO line of the failure). Else the failure is unexplained: a
        warning with the reason.
        """
        ctx = self._ctx
        newer = ctx.wait_for_view(lambda v: v.version > self.version, ctx.collective_timeout_s)
        if newer is not None and newer.version > self.version:
            log.info(
                "rank %d: view %d ended under this rank's operations, no member dead: the "
                "group moved on to view %d (ranks %s)",
                ctx.rank,
                self.version,
                newer.version,
                list(newer.members),
            )
            return
        if ctx.closed.is_set():
            return
        log.warning(
            "rank %d: view %d failed and every member is alive: %s",
            ctx.rank,
            self.version,
            failure.reason,
        )

    def leave(self, reason: str) -> None:
        """This rank gives the view up while members may still run on it: poison it, no evidence.

        Idempotent, and a no-op on a view that already failed.
        """
        self.fail(reason, report=False)

    def inject_link_failure(self, peer: int) -> None:
        """Fail the view as if the link to ``peer`` broke (fault injection for tests and drills)."""
        self.fail(f"injected link failure between rank {self._ctx.rank} and rank {peer}", (peer,))

    def retire(self, *, wake: bool = False, next_members: tuple[int, ...] | None = None) -> None:
        """A newer view superseded this one: abandon its backend, free this rank's watcher.

        Operations still in flight keep running (peers that have not moved on may finish them);
        ``wake``: wake each of them, the data plane is closing. ``next_members``: the newer
        view's members; if they are a strict subset of this view's and include this rank, the
        NCCL communicator is kept for the newer view to shrink (it claims or releases it).
        """
        with self._cond:
            if self._retired:
                return
            self._retired = True
            parent, self._parent = self._parent, None  # never built: the parent goes as usual
            backend, self._backend = self._backend, None  # the reaper must hold the last reference
            parked: dict[str, object] | None = None
            if (
                self._kept_for_configuration()
                and backend is not None
                and self._built
                and self._failure is None
                and self._inflight == 0
            ):  # torch's model has not taken them yet: they are kept for it
                parked = {"cpu": backend}
                if self._cuda is not None and not self._aborted:
                    parked["cuda"], self._cuda = self._cuda, None
                backend = None
                lender, self._lender = self._lender, None
                if lender is not None:
                    lender.hand_over(parked["cpu"])
            if backend is not None and self._inflight > 0:
                self._orphan, backend = backend, None  # released by the last op_ended()
            ending = None if wake else self._lent_orphan_to_end()
            cuda = connecting = None
            self._cuda_reserved = (
                self._ctx.nccl_shrink
                and next_members is not None
                and self._ctx.rank in next_members
                and set(next_members) < set(self.members)
                and self._cuda is not None
                and not self._aborted
            )
            # with operations in flight: released by the last op_ended(), or aborted on failure
            if self._inflight == 0 and not self._cuda_reserved:
                cuda, self._cuda = self._cuda, None
            connecting, self._cuda_connecting = self._cuda_connecting, None
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
        if parent is not None:
            parent.release_cuda()
        self._end_lent_orphan(ending)
        if parked is not None:
            self._ctx.park(self.version, self.members, parked)
        self._release_gloo(backend)
        for nccl in (cuda, connecting):
            self._ctx.kind.abandon(nccl)  # aborted (again: idempotent) and kept, never destroyed
        for work in pending:
            work.wake()

    def _lent_orphan_to_end(self) -> object | None:
        """Under ``_cond``: the lent backend of a failed view this rank moved on from, whose
        operations are still in gloo, marked as coming back to its lender; else None.

        Nobody may use such a view any more, so its operations are ended (the next view then
        reconfigures the backend instead of building another); once only.
        """
        orphan = self._orphan
        if (
            orphan is None
            or self._lender is None
            or self._failure is None
            or not self._retired
            or self._ending
        ):
            return None
        self._ending = self._ending_now = True
        return orphan

    def _end_lent_orphan(self, orphan: object | None) -> None:
        """End the operations of ``orphan`` (see :meth:`_lent_orphan_to_end`) in a thread of
        its own, and only then let it go: ending them probes each peer's connection in turn,
        which must not reach the next view's (the backend, once back, is reconfigured)."""
        if orphan is None:
            return

        def end() -> None:
            try:
                end_gloo_operations(orphan, self.index(self._ctx.rank), len(self.members))
            finally:
                with self._cond:
                    self._ending_now = False
                    idle = self._inflight == 0 and self._orphan is orphan
                    if idle:
                        self._orphan = None
                    self._cond.notify_all()
                if idle:
                    self._release_gloo(orphan)

        self._spawn(end, f"dataplane-end-v{self.version}")

    def _release_gloo(self, backend: object | None) -> None:
        """Let the view's gloo backend go: back to its lender (views reconfigure one backend),
        else released (:meth:`BackendKind.abandon`)."""
        if self._lender is not None:
            self._lender.give_back(backend)
        else:
            self._ctx.kind.abandon(backend)

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
        self._spawn(self._watch_retired, f"dataplane-retired-watch-v{self.version}")

    def _watch_retired(self) -> None:
        """Look for ``poisoned/<v>`` while this rank still has operations in flight on the view:
        a member that has not moved on poisons it when its own operation fails, and the
        operations here fail from that notice. Leaves once none is in flight, once the view
        failed, or once the data plane closes.

        It looks every ``RETIRED_WATCH_SLICE_S`` (``check``: one short round trip), never
        waits inside the store: a wait that times out makes torch's store client log a warning,
        and a thread inside a store call when the interpreter shuts down aborts the process.
        """
        key = keys.poisoned(self.version)
        closed = self._ctx.closed
        raw: bytes | None = None
        try:
            with self._ctx.rendezvous_store() as store:
                while raw is None:
                    with self._cond:
                        self._cond.wait_for(
                            lambda: (
                                self._failure is not None or self._inflight == 0 or closed.is_set()
                            ),
                            RETIRED_WATCH_SLICE_S,
                        )
                        if self._failure is not None or self._inflight == 0 or closed.is_set():
                            self._retired_watch = False
                            self._cond.notify_all()
                            return
                    if store.check([key]):
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
                self._cond.notify_all()
            return
        with self._cond:
            self._retired_watch = False
            self._cond.notify_all()
        self.fail_from(PoisonNotice.read(self.version, raw))
