"""``DataPlane``: one rank's torch data plane, following the views the coordinator commits.

The agent owns the data plane: it calls ``install_view`` for each committed view and turns
``on_link_evidence`` calls into ``links`` events. The training loop uses ``process_group()``.

Threads (all daemons) and their store clients. A TCPStore client serializes its operations, so
whatever may block for long gets a client of its own. The clients, the heartbeat and the watcher
belong to one *store session*; ``switch_store`` opens a session on another store (the
coordinator that hosts it restarted or failed over) and every later view rendezvouses there:
- the heartbeat thread (liveness counter, see :mod:`agent.dataplane.liveness`) and the decider
  threads (one per failed view: poison the members, read liveness, report) share the control
  client: their operations are short;
- the watcher thread, blocked on ``fail/<v>/<rank>`` of the current view, has its own: a poison
  notice there fails the view at once (see :mod:`agent.dataplane.poison`);
- one builder thread per installed view in which this rank is active takes a rendezvous client
  that no other rendezvous is using (see ``rendezvous_store``); so does the watch of a view this
  rank moved on from while an operation of its own still runs there (see :mod:`agent.dataplane.view`);
- the reaper thread releases retired backends (see :mod:`agent.dataplane.backend`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import torch
from torch.distributed import DistStoreError, PrefixStore, Store, TCPStore

from . import keys
from .backend import BackendKind, bury, drain_released
from .cuda import CudaWatch, EndEvents
from .errors import DataPlaneError
from .group import ElasticProcessGroup
from .hint import HintPool
from .liveness import Heartbeat
from .persistent import SUPPORTED as GLOO_RECONFIGURE_SUPPORTED
from .persistent import PersistentGloo
from .poison import PoisonNotice
from .view import ViewGroup

log = logging.getLogger(__name__)

LinkEvidence = Callable[[int, dict[int, str], list[int]], None]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CPU = torch.device("cpu")
#: The longest wait of the poison watch. Whatever ends a watch writes its key (a newer view
#: or ``close()``: ``RETIRED``; a failure: the poison notice; a move to another store:
#: ``RETIRED`` on the old one), so it never times out in practice: a store wait that times
#: out makes torch's store client log a warning.
_WATCH_SLICE = timedelta(hours=24)
#: How long ``close()`` waits for the operations it ended to come back from gloo.
_CLOSE_OPS_WAIT_S = 5.0
#: how many views' failure counts ``ops_at_failure`` keeps
_FAILED_OPS_KEPT = 8


@dataclass
class _StoreSession:
    """The data plane's clients of one store, and the liveness heartbeat it keeps there."""

    host: str
    port: int
    control: Store
    watch: Store
    heartbeat: Heartbeat
    rendezvous_idle: list[Store] = field(default_factory=list)
    watcher: threading.Thread | None = None
    #: the gloo backend that each view reconfigures (``gloo_reconfigure``), else None
    gloo: PersistentGloo | None = None


class DataPlane:
    """One rank's data plane. See the module docstring and ``docs/dataplane.md``.

    ``on_link_evidence(version, peers, failed_ranks_hint)`` is called from a data plane thread:
    with ``{peer: "down"}`` for the ranks a failed view blames (and the same list as the hint),
    and with ``{peer: "up"}`` for every other member once a view's backend is built (connected).
    It must not block. ``store_prefix`` (say, the group's name) puts every key under
    ``<prefix>/`` when one store serves several groups. ``gloo_hostname`` is the address peers reach this process at (default: loopback when
    the store is on loopback, else this host's name).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        store_host: str,
        store_port: int,
        *,
        incarnation: str,
        backend: str = "gloo",
        device: torch.device | None = None,
        collective_timeout_s: float = 30.0,
        p2p_timeout_s: float = 30.0,
        on_link_evidence: LinkEvidence | None = None,
        store_prefix: str = "",
        gloo_hostname: str | None = None,
        liveness_period_s: float = 0.1,
        liveness_window_periods: int = 3,
        store_timeout_s: float = 30.0,
        hint_pool_size: int = 8,
        eager_cuda: bool = True,
        nccl_shrink: bool | None = None,
        abort_grace_s: float | None = None,
        gloo_reconfigure: bool | None = None,
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is out of range 0..{world_size - 1}")
        if not incarnation or "/" in incarnation:
            raise ValueError(
                f"incarnation must be a non-empty string without '/', got {incarnation!r}"
            )
        for what, value in (
            ("collective_timeout_s", collective_timeout_s),
            ("p2p_timeout_s", p2p_timeout_s),
            ("liveness_period_s", liveness_period_s),
        ):
            if not value > 0:
                raise ValueError(f"{what} must be positive, got {value!r}")
        if liveness_window_periods < 2:
            raise ValueError(f"liveness_window_periods must be >= 2, got {liveness_window_periods}")
        self.rank = rank
        self.world_size = world_size
        self.incarnation = incarnation
        self.collective_timeout_s = float(collective_timeout_s)
        self.p2p_timeout_s = float(p2p_timeout_s)
        self.liveness_period_s = float(liveness_period_s)
        self.liveness_window_periods = int(liveness_window_periods)
        self._store_prefix = store_prefix
        self._store_timeout_s = store_timeout_s
        self._on_link_evidence = on_link_evidence
        if gloo_hostname is None:
            import socket

            gloo_hostname = "127.0.0.1" if store_host in _LOOPBACK else socket.gethostname()
        self.gloo_hostname = gloo_hostname  # also where the elastic DDP serves heals
        self.kind = BackendKind.resolve(backend, device, gloo_hostname, eager_cuda=eager_cuda)
        self.device = self.kind.device
        self.closed = threading.Event()
        self._hint_pool_size = hint_pool_size
        self._hint_pools: dict[str, HintPool] = {"cpu": HintPool(world_size, _CPU, hint_pool_size)}
        #: set by the first operation on a CUDA tensor; views after it build NCCL with the view
        self.cuda_used = False
        if nccl_shrink is None:  # FOLDPLANE_NCCL_SHRINK=0 turns it off
            nccl_shrink = os.environ.get("FOLDPLANE_NCCL_SHRINK", "1") != "0"
        #: a survivors-only view shrinks the previous view's NCCL communicator
        self.nccl_shrink = bool(nccl_shrink) and self.kind.name == "nccl"
        #: a failed view's NCCL communicator waits this long for a shrink, then is aborted
        self.abort_grace_s = (
            2 * self.liveness_period_s * self.liveness_window_periods
            if abort_grace_s is None
            else float(abort_grace_s)
        )
        if gloo_reconfigure is None:  # FOLDPLANE_GLOO_RECONFIGURE=1 turns it on
            gloo_reconfigure = (
                os.environ.get("FOLDPLANE_GLOO_RECONFIGURE", "0") == "1"
                and GLOO_RECONFIGURE_SUPPORTED
            )
        elif gloo_reconfigure and not GLOO_RECONFIGURE_SUPPORTED:
            raise ValueError(
                f"gloo_reconfigure needs torch's reconfigure API (torch >= 2.14), not torch "
                f"{torch.__version__}"
            )
        #: views reconfigure this rank's gloo backends (agent.dataplane.persistent) instead of
        #: building a fresh one each; off by default: no faster on a CPU, and two more store
        #: clients per rank (docs/dataplane.md)
        self.gloo_reconfigure = bool(gloo_reconfigure)
        self.cuda_watch = CudaWatch(
            self.closed, self.liveness_period_s * self.liveness_window_periods
        )
        self.end_events = EndEvents() if self.kind.name == "nccl" else None

        self._lock = threading.Condition()
        self._view: ViewGroup | None = None
        #: every view installed and still referenced (by an operation in flight, say)
        self._views: weakref.WeakSet[ViewGroup] = weakref.WeakSet()
        #: the group was shut down (``shutdown_with_save``): no view follows the installed one
        self._final = False
        self._failed_ops: dict[int, tuple[int, int]] = {}  # see ops_at_failure
        self._rendezvous_lock = threading.Lock()
        #: a group of torch's reconfigure model runs here (serve_configurations)
        self.configurations = False
        #: backends of reconfigure views retired before their group claimed them, by version
        self._parked: dict[int, tuple[tuple[int, ...], dict[str, object]]] = {}
        self._session = self._open_session(store_host, store_port)
        self._group = ElasticProcessGroup(self)
        self._start_watcher(self._session)
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- the surface the agent calls ----------------------------------------------------------

    @property
    def ready(self) -> bool:
        """The store is reachable and the local device is set up (the agent's ``self_ready``)."""
        return not self.closed.is_set() and self._session.heartbeat.healthy

    @property
    def store_address(self) -> tuple[str, int]:
        """The ``(host, port)`` of the store this data plane uses now."""
        session = self._session
        return session.host, session.port

    def switch_store(self, host: str, port: int, *, force: bool = False) -> None:
        """Use the store at ``host:port`` from now on (the one the coordinator advertises).

        The store lives in the coordinator process, so a coordinator restart or failover brings
        a new one. Connects new clients there, registers this incarnation and its liveness
        counter, and restarts the heartbeat and the poison watch on it; every later view
        rendezvouses there. The installed view keeps its backend (its links do not go through
        the store), and the ``ElasticProcessGroup`` stays the same object. The same address is
        a no-op, unless ``force``: a coordinator restarted on the same fixed port serves another
        store there, which lost every key. If the new store cannot be reached, raises
        ``DataPlaneError`` naming it and keeps the old one.
        """
        if self.closed.is_set():
            raise DataPlaneError(
                f"rank {self.rank}: cannot switch to the store at {host}:{port}: "
                "the data plane is closed"
            )
        if (host, port) == self.store_address and not force:
            return
        session = self._open_session(host, port)
        with self._lock:
            if self.closed.is_set():
                session.heartbeat.stop(wait=False)
                raise DataPlaneError(
                    f"rank {self.rank}: the data plane closed while switching to {host}:{port}"
                )
            old, self._session = self._session, session
            view = self._view
            self._lock.notify_all()  # the old watcher leaves at its next look
        if view is not None and view.active:
            # The liveness check of the installed view reads its members on the new store.
            try:
                session.control.set(keys.member(view.version, self.rank), self.incarnation)
            except RuntimeError as e:
                log.warning("rank %d: cannot register view %d: %s", self.rank, view.version, e)
        old.heartbeat.stop(wait=False)  # the old store may be gone: never wait on it
        if old.gloo is not None:  # its bootstrap store is the old one
            old.gloo.close()
        if view is not None and view.active:
            # free the old watcher if the old store still answers (if not, its wait fails)
            with contextlib.suppress(RuntimeError):
                old.control.set(keys.fail(view.version, self.rank), keys.RETIRED)
        bury(old.watch)  # the old watcher may still be blocked on it
        self._start_watcher(session)
        log.info(
            "rank %d: data plane moved from store %s:%d to %s:%d",
            self.rank,
            old.host,
            old.port,
            host,
            port,
        )

    def install_view(
        self, version: int, active_ranks: Sequence[int], order: Sequence[int] | None = None
    ) -> None:
        """Follow committed view ``version``; returns at once (the backend builds in the background).

        ``order``: the active ranks in the order of a reconfigure's handles (the view's cause);
        the view's backend then numbers them so (every member gets the same ``order`` from the
        committed view), and the group of torch's model takes that backend as its
        configuration's (:meth:`claim_view`). Otherwise global rank order.

        A version not newer than the installed one is ignored (a replayed update), unless it
        names other ranks than the installed view of that version: that is a conflict.
        """
        members = self._check_view(version, active_ranks)
        if order is not None:
            ordered = tuple(order)
            if sorted(ordered) != list(members):
                raise ValueError(
                    f"view {version}: order {list(ordered)} is not the active ranks "
                    f"{list(members)} in some order"
                )
            members = ordered
        with self._lock:
            if self.closed.is_set():
                raise DataPlaneError(
                    f"rank {self.rank}: cannot install view {version}: the data plane is closed"
                )
            old = self._view
            if old is not None and version <= old.version:
                if version == old.version and members != old.members:
                    raise DataPlaneError(
                        f"view {version} is already installed with active ranks {list(old.members)}, "
                        f"not {list(members)}"
                    )
                return
            view = ViewGroup(version, members, self, parent=old, ordered=order is not None)
            self._view = view
            self._views.add(view)
            self._lock.notify_all()
        if old is not None:
            old.retire(next_members=members)
        view.start()

    @property
    def hint_pool(self) -> HintPool:
        """The hint buffers of operations on this plane's own device (CUDA for ``"nccl"``)."""
        return self.hint_pool_for(self.device.type)

    def hint_pool_for(self, device_type: str) -> HintPool:
        """The hint buffers of operations on ``device_type`` tensors (made at first use)."""
        pool = self._hint_pools.get(device_type)
        if pool is None:
            device = self.device if device_type == self.device.type else torch.device(device_type)
            pool = self._hint_pools.setdefault(
                device_type, HintPool(self.world_size, device, self._hint_pool_size)
            )
        return pool

    def process_group(self) -> ElasticProcessGroup:
        """The one process group of this process; it follows the installed views."""
        return self._group

    def build_subgroup(
        self, name: str, group_rank: int, group_size: int, timeout_s: float
    ) -> object:
        """A backend for torch's subgroup ``name`` (``dist.new_group`` on the foldplane group).

        A plain backend of this data plane's kind (gloo or NCCL) over the ranks torch names,
        ``group_rank`` of ``group_size``, rendezvoused on the coordinator's store under the
        installed view's version (a later job on the same store never meets stale keys). It
        does not follow views: a member's failure fails its operations with the backend's own
        error, and a rank that joins later is not in it. Blocks until every member has called.
        """
        view = self._view
        version = 0 if view is None else view.version
        host, port = self.store_address
        client = self.connect_store(host, port)  # its own: the rendezvous may wait long
        store = PrefixStore(keys.subgroup_prefix(version, name), client)
        try:
            return self.kind.create(store, group_rank, group_size, timeout_s)
        except RuntimeError as e:
            raise DataPlaneError(
                f"rank {self.rank}: building subgroup {name!r} (rank {group_rank} of "
                f"{group_size}, view {version}) failed: {e}"
            ) from e

    def inject_link_failure(self, peer: int) -> None:
        """Fault injection: fail the current view on this rank as if its link to ``peer`` broke.

        The view fails on every member (this rank poisons it, as with a real broken link); this
        rank's hint names ``peer``, ``peer``'s hint names this rank, the other members' name
        ``peer``. The next installed view is not affected.
        """
        if not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"peer {peer!r} must be another rank in 0..{self.world_size - 1}")
        view = self.current_view()
        if view is None or not view.active or peer not in view.members:
            raise DataPlaneError(
                f"rank {self.rank} has no link to rank {peer} to break: both must be active in the "
                f"installed view (view {None if view is None else view.version}, "
                f"active ranks {None if view is None else list(view.members)})"
            )
        view.inject_link_failure(peer)

    def close(self) -> None:
        """Stop the threads, end this rank's operations still running on any view (their
        ``wait`` raises) and release every backend.

        Nothing of the data plane outlives it in gloo: an operation left waiting on a view the
        group moved on from (a peer never joined it, and a peer's forked child, such as a
        ``DataLoader`` worker, may hold that peer's connections open) would end when that peer's
        process tree exits, perhaps while this interpreter shuts down, and abort this process
        (see :mod:`agent.dataplane.backend`).
        """
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            view, self._view = self._view, None
            views = list(self._views)
            self._lock.notify_all()
        if view is not None:
            view.retire(wake=True)
        with self._lock:
            parked, self._parked = list(self._parked.values()), {}
        for _, backends in parked:
            for backend in backends.values():
                self.kind.abandon(backend)
        session = self._session
        session.heartbeat.stop()
        if session.gloo is not None:
            session.gloo.close()
        if session.watcher is not None:
            session.watcher.join(timeout=2.0)
        busy = [v for v in views if v.busy]
        for v in busy:
            v.end_operations()
        deadline = time.monotonic() + _CLOSE_OPS_WAIT_S
        for v in views:  # a build in progress (a view committed as this rank closes) ends in
            # torch soon, its peers build it too, as does a failed view's hint; a daemon thread
            # that returns from torch while the interpreter shuts down aborts the process
            # (ViewGroup.wait_threads_left)
            if not v.wait_threads_left(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "rank %d: a thread of view %d (%s) is still in torch after close",
                    self.rank,
                    v.version,
                    ", ".join(v.threads_alive()),
                )
        for v in views:  # their operations ended, the watches of views left behind are gone
            if not v.wait_idle(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "rank %d: an operation of view %d still runs in gloo after close",
                    self.rank,
                    v.version,
                )
        drain_released(timeout=5.0)  # a backend destroyed during interpreter exit aborts it
        bury(session.watch)  # the watcher may still be blocked on it if the store is gone

    def __enter__(self) -> DataPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the group and the views use -----------------------------------------------------

    def current_view(self) -> ViewGroup | None:
        return self._view

    def wait_for_view(
        self, predicate: Callable[[ViewGroup], bool], timeout: float | None
    ) -> ViewGroup | None:
        """Block until the installed view passes ``predicate`` (or the plane closes, or the
        group is shut down: no other view will come); return it.

        Returns the installed view (None before the first one) at the deadline either way.
        """
        with self._lock:
            self._lock.wait_for(
                lambda: (
                    self.closed.is_set()
                    or self._final
                    or (self._view is not None and predicate(self._view))
                ),
                timeout,
            )
            return self._view

    def no_more_views(self) -> None:
        """The group was shut down: no view follows the installed one, so nobody waits for
        one (a step on a failed view is skipped at once, and the caller sees its shutdown)."""
        with self._lock:
            self._final = True
            self._lock.notify_all()

    def view_for_op(self, op: str) -> ViewGroup:
        """The view an operation runs on; local misuse (closed, no view yet) raises."""
        view = self._view
        if self.closed.is_set():
            raise DataPlaneError(f"{op} on rank {self.rank}: the data plane is closed")
        if view is None:
            raise DataPlaneError(f"{op} on rank {self.rank}: no view has been installed yet")
        return view

    @property
    def backend_timeout_s(self) -> float:
        return max(self.collective_timeout_s, self.p2p_timeout_s)

    def set_timeouts(
        self, *, collective_s: float | None = None, p2p_s: float | None = None
    ) -> None:
        if collective_s is not None:
            self.collective_timeout_s = collective_s
        if p2p_s is not None:
            self.p2p_timeout_s = p2p_s

    def control_store(self) -> Store:
        return self._session.control

    def serve_configurations(self) -> None:
        """A group of torch's reconfigure model runs on this plane: the backends of views a
        reconfigure committed are kept for it until it claims them (:meth:`claim_view`), even
        if a newer view is installed first."""
        self.configurations = True

    def park(self, version: int, members: tuple[int, ...], backends: dict[str, object]) -> None:
        """Keep the backends of reconfigure view ``version`` (retired unclaimed) for a claim."""
        with self._lock:
            if not self.closed.is_set():
                self._parked[version] = (members, backends)
                return
        for backend in backends.values():
            self.kind.abandon(backend)

    def claim_view(
        self, version: int, members: Sequence[int], deadline: float
    ) -> dict[str, object]:
        """The backends of reconfigure view ``version`` over ``members`` (in handle order),
        now the caller's: the view itself runs nothing more on them. Waits for the view's
        build until ``deadline`` (``time.monotonic()``); ``DataPlaneError`` naming why when the
        view has no such backend (its build failed, it was installed with another order, or
        this rank never installed it). Parked backends of older views are released."""
        members = tuple(members)
        with self._lock:
            parked = self._parked.pop(version, None)
            released = [self._parked.pop(v) for v in [v for v in self._parked if v < version]]
            view = next((v for v in self._views if v.version == version), None)
        for _, old in released:
            for backend in old.values():
                self.kind.abandon(backend)
        backends: dict[str, object] | None = None
        if parked is not None:
            if parked[0] == members:
                backends = parked[1]
            else:
                for backend in parked[1].values():
                    self.kind.abandon(backend)
        elif view is not None and view.members == members:
            backends = view.hand_over(deadline)
            if backends is None:  # retired while it built: the build parked its backend
                with self._lock:
                    late = self._parked.pop(version, None)
                if late is not None:
                    backends = late[1]
        if backends is None:
            if view is not None and view.failure is not None:
                reason = f"its build failed: {view.failure.reason}"
            elif view is not None and view.members != members:
                reason = f"it was installed over {list(view.members)}"
            else:
                reason = "this rank did not build it"
            raise DataPlaneError(
                f"rank {self.rank}: view {version} has no backend over {list(members)}: {reason}"
            )
        return backends

    @property
    def persistent_gloo(self) -> PersistentGloo | None:
        """The gloo backend views reconfigure (``gloo_reconfigure``), else None: fresh ones."""
        return self._session.gloo

    @contextmanager
    def rendezvous_store(self) -> Iterator[Store]:
        """A store client for one backend's rendezvous, not shared with a rendezvous in progress.

        A rendezvous waiting for an absent member holds its client (a client serializes its
        operations), so a concurrent one takes another. Clients are kept and reused: connecting
        one can take seconds on a loaded host.
        """
        session = self._session  # a client goes back to the session it came from
        with self._rendezvous_lock:
            client = session.rendezvous_idle.pop() if session.rendezvous_idle else None
        if client is None:
            client = self.connect_store(session.host, session.port)
        try:
            yield client
        finally:
            with self._rendezvous_lock:
                session.rendezvous_idle.append(client)

    def connect_store(self, host: str, port: int) -> Store:
        """A new client of the store at ``host:port``, under this data plane's prefix."""
        store: Store = TCPStore(
            host,
            port,
            is_master=False,
            timeout=timedelta(seconds=self._store_timeout_s),
            wait_for_workers=False,
        )
        prefix = self._store_prefix
        return PrefixStore(prefix, store) if prefix else store

    def _open_session(self, host: str, port: int) -> _StoreSession:
        """Connect the clients to the store at ``host:port`` and start the heartbeat there."""
        try:
            control = self.connect_store(host, port)
            rendezvous = self.connect_store(host, port)
            watch = self.connect_store(host, port)
            # each reconfigurable backend's bootstrap store: a client of its own, made here
            gloo = (
                PersistentGloo(
                    self.rank,
                    self.world_size,
                    self.kind,
                    lambda: self.connect_store(host, port),
                    self.backend_timeout_s,
                )
                if self.gloo_reconfigure
                else None
            )
            heartbeat = Heartbeat(control, self.rank, self.incarnation, self.liveness_period_s)
        except RuntimeError as e:  # DistNetworkError, DistStoreError: nobody listens there
            raise DataPlaneError(
                f"rank {self.rank}: cannot reach the rendezvous store at {host}:{port}: {e}"
            ) from e
        try:
            control.set(keys.incarnation(self.rank), self.incarnation)
        except RuntimeError as e:
            heartbeat.stop(wait=False)
            raise DataPlaneError(
                f"rank {self.rank}: cannot register at the rendezvous store {host}:{port}: {e}"
            ) from e
        session = _StoreSession(host, port, control, watch, heartbeat, [rendezvous])
        session.gloo = gloo
        return session

    def _start_watcher(self, session: _StoreSession) -> None:
        session.watcher = threading.Thread(
            target=self._watch, args=(session,), name=f"dataplane-watch-{self.rank}", daemon=True
        )
        session.watcher.start()

    def report_links(
        self,
        version: int,
        peers: dict[int, str],
        failed: list[int],
        ops: tuple[int, int] | None = None,
    ) -> None:
        if ops is not None:
            with self._lock:
                self._failed_ops[version] = ops
                while len(self._failed_ops) > _FAILED_OPS_KEPT:
                    del self._failed_ops[min(self._failed_ops)]
        callback = self._on_link_evidence
        if callback is None or self.closed.is_set():
            return
        try:
            callback(version, peers, failed)
        except Exception:  # the agent's bug must not kill a data plane thread
            log.exception("rank %d: on_link_evidence raised for view %d", self.rank, version)

    def ops_at_failure(self, version: int) -> tuple[int, int] | None:
        """(issued, completed): the operations this rank had started, and finished successfully,
        on view ``version`` when it failed here (None if it has not failed, or long ago). The
        agent reports them with a failure that blames nobody (``coordinator.fold.stalls``)."""
        with self._lock:
            return self._failed_ops.get(version)

    # -- the watcher --------------------------------------------------------------------------

    def _watch(self, session: _StoreSession) -> None:
        """Wait on this rank's poison key of each active view in turn; fail the view it names.

        One watcher per store session: it leaves once the data plane moved to another store.
        """
        watched: ViewGroup | None = None
        while True:
            with self._lock:
                while (
                    not self.closed.is_set()
                    and self._session is session
                    and (self._view is None or self._view is watched or not self._view.active)
                ):
                    self._lock.wait()
                if self.closed.is_set() or self._session is not session:
                    return
                view = watched = self._view
            assert view is not None
            notice = self._wait_for_notice(view, session)
            if notice is not None:
                view.fail_from(notice)

    def _wait_for_notice(self, view: ViewGroup, session: _StoreSession) -> PoisonNotice | None:
        key = keys.fail(view.version, self.rank)
        while (
            not self.closed.is_set()
            and self._session is session
            and self._view is view
            and view.failure is None
        ):
            try:
                session.watch.wait([key], _WATCH_SLICE)
                raw = session.watch.get(key)
            except DistStoreError:  # this slice's wait timed out: check why we watch, then again
                continue
            except RuntimeError as e:  # DistNetworkError: the store is down or restarting
                log.warning(
                    "rank %d: watching view %d: store unreachable: %s", self.rank, view.version, e
                )
                self.closed.wait(1.0)
                continue
            if raw == keys.RETIRED:
                return None
            return PoisonNotice.read(view.version, raw)
        return None

    # -- checks -------------------------------------------------------------------------------

    def _check_view(self, version: int, active_ranks: Sequence[int]) -> tuple[int, ...]:
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"view version must be an int >= 1, got {version!r}")
        ranks = list(active_ranks)
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad:
            raise ValueError(
                f"view {version}: active ranks {bad} are out of range 0..{self.world_size - 1}"
            )
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"view {version}: active ranks {ranks} contain duplicates")
        if not ranks:
            raise ValueError(f"view {version}: no active ranks")
        return tuple(sorted(ranks))


def _close_at_exit(ref: weakref.ref[DataPlane]) -> None:
    """Close a data plane the program left open: its backends must go before the interpreter."""
    plane = ref()
    if plane is not None:
        plane.close()
