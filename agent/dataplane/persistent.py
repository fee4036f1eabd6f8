"""One gloo backend for every view: torch's reconfigure under the data plane (torch >= 2.14).

With ``DataPlane(gloo_reconfigure=True)`` or ``FOLDPLANE_GLOO_RECONFIGURE=1`` (torch >= 2.14;
the default is the fresh path of :mod:`agent.dataplane.backend`, a new ``ProcessGroupGloo`` per
view) a rank keeps ``ProcessGroupGloo`` backends built with ``enable_reconfigure=True`` per
store session, and each view it is active in reconfigures one, in three steps that every member
takes alike:

1. it publishes the backend's current handle under ``gloo-handle/<v>/<rank>``: a gloo handle
   names the backend's rank and uuid of its last reconfigure, so it changes with each one;
2. it reads the members' handles, in view-rank order (the order of ``ViewGroup.members``);
3. it calls ``reconfigure(uuid, handles)`` with :func:`view_uuid` of the view: gloo then
   rendezvouses on the backend's bootstrap store (this rank's own client of the coordinator's
   store, under ``gloo/``) in ``reconfigure/<uuid>/``, and refuses a uuid used before there.

A rank keeps up to ``POOL`` (2) such backends, each lent to one view at a time: a view that
follows a failure gets the other one at once, while the failed view's operation still ends on
the first (the survivors' view is built beside the failure's detection, as a fresh one is).
A view gives its backend back when it lets it go (retired with nothing in flight, or when its
last operation ends); the operations of a failed view this rank moved on from are ended
(:func:`agent.dataplane.backend.end_gloo_operations`) as soon as both are true, so the backend
is back within milliseconds of the failure being known. When superseded views hold every
backend, the next view waits up to ``RETURN_WAIT_S`` for one, then builds another; a backend
whose reconfigure failed (gloo leaves its state undefined) is released, like one given back to
a full pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta

from torch.distributed import PrefixStore, ProcessGroupGloo, Store
from torch.distributed import distributed_c10d as _c10d

from . import keys
from .backend import BackendKind

log = logging.getLogger(__name__)

#: torch's gloo is reconfigurable from torch 2.14 (``ReconfigureOptions``).
SUPPORTED = hasattr(_c10d, "ReconfigureOptions")
#: the prefix of the backend's bootstrap store, under the data plane's own prefix
BOOTSTRAP_PREFIX = "gloo/"
#: the low bits of a view's uuid: its attempt (see :func:`view_uuid`)
ATTEMPT_BITS = 8
#: how many reconfigurable backends a rank keeps: the installed view's, and one for the next
#: view while a superseded view's operation still ends on the other
POOL = 2
#: how long a view waits for a backend when superseded views still hold all of them
RETURN_WAIT_S = 1.0


def view_uuid(version: int, attempt: int = 0) -> int:
    """The uuid of view ``version``'s reconfigure: ``version << 8 | attempt``.

    Every member derives the same one, and no two reconfigures on one store share it: versions
    grow for the life of a group (each group has its own store prefix) and a view's build is
    tried once (a failed build fails the view; the next view has the next version), so the
    attempt is 0 here; it keeps a retry of the same version distinct from the first try.
    """
    if not 0 <= attempt < 1 << ATTEMPT_BITS:
        raise ValueError(f"attempt must be in 0..{(1 << ATTEMPT_BITS) - 1}, got {attempt}")
    return version << ATTEMPT_BITS | attempt


class PersistentGloo:
    """This rank's reconfigurable gloo backends of one store session (see the module doc).

    ``connect`` makes each backend's own client of the store (its bootstrap store, which gloo
    keeps for every reconfigure; one per backend, as a client serializes its operations and a
    reconfigure waits in the store for its peers). The first ``POOL`` clients are made here,
    when the session opens, not when a view builds its backend: a client's connect may take
    seconds (torch names the store's address with a reverse DNS lookup on each connect, and a
    resolver that drops a query holds it for its whole timeout, 5 s by glibc's default), which
    must not count against a view's build deadline. Only a backend beyond ``POOL`` (superseded
    views hold both) connects while a view builds. ``built`` and ``reconfigured`` count
    backends made and reconfigures done.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        kind: BackendKind,
        connect: Callable[[], Store],
        timeout_s: float,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._kind = kind
        self._connect = connect
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._idle: list[object] = []  # ready to be lent, the most recently used last
        self._lent: list[object] = []  # lent to views (the installed one, superseded ones)
        self._closed = False
        # the bootstrap clients of the first POOL backends, connected before any deadline
        self._clients: list[Store] = [connect() for _ in range(POOL)]
        self.built = 0
        self.reconfigured = 0

    def build(self, store: Store, version: int, members: Sequence[int], timeout_s: float) -> object:
        """The backend of view ``version`` over ``members`` (view-rank order), reconfigured;
        blocks until every member has reconfigured, as a fresh build blocks until they built.
        ``RuntimeError`` if a member never published its handle or the reconfigure failed."""
        backend = self._borrow(timeout_s)
        timeout = timedelta(seconds=timeout_s)
        try:
            store.set(keys.gloo_handle(version, self.rank), backend.get_reconfigure_handle())  # type: ignore[attr-defined]
            names = [keys.gloo_handle(version, m) for m in members]
            store.wait(names, timeout)
            handles = [h.decode() for h in store.multi_get(names)]
        except RuntimeError:
            self.give_back(backend)  # untouched: the next view may reconfigure it
            raise
        opts = _c10d.ReconfigureOptions()
        opts.uuid = view_uuid(version)
        opts.handles = handles
        opts.timeout = timeout
        try:
            backend.reconfigure(opts).wait()  # type: ignore[attr-defined]
        except RuntimeError:
            self._forget(backend)
            raise
        with self._cond:
            self.reconfigured += 1
        return backend

    def give_back(self, backend: object | None) -> None:
        """A view lets ``backend`` go: a lent one becomes idle (a later view reconfigures it)
        unless ``POOL`` are idle already; any other (forgotten, or of a closed session) is
        released."""
        if backend is None:
            return
        with self._cond:
            mine = _pop(self._lent, backend) and not self._closed
            keep = mine and len(self._idle) < POOL
            if keep:
                self._idle.append(backend)
                self._cond.notify_all()
        if not keep:
            self._kind.abandon(backend)

    def hand_over(self, backend: object) -> None:
        """The lent ``backend`` leaves for good (torch's model took a view's backend)."""
        with self._cond:
            _pop(self._lent, backend)

    def close(self) -> None:
        """The session ends: release the idle backends; a lent one when it is given back."""
        with self._cond:
            self._closed = True
            idle, self._idle, self._lent = self._idle, [], []
            self._clients = []
        for backend in idle:
            self._kind.abandon(backend)

    def _borrow(self, timeout_s: float) -> object:
        with self._cond:
            if self._closed:
                raise RuntimeError("the data plane's store session is closed")
            stale: list[object] = []
            if timeout_s != self._timeout_s:  # a backend's own timeout is set at its creation
                self._timeout_s, stale, self._idle = timeout_s, self._idle, []
            if not self._idle and len(self._lent) >= POOL:
                # superseded views still run operations on every backend: a failed view's are
                # ended (within milliseconds of its failure being known), another's may finish
                self._cond.wait_for(lambda: bool(self._idle) or self._closed, RETURN_WAIT_S)
            backend = self._idle.pop() if self._idle else None
            if backend is not None:
                self._lent.append(backend)
        for old in stale:
            self._kind.abandon(old)
        if backend is not None:
            return backend
        backend = self._create()  # none idle: one more (released when given back to a full pool)
        with self._cond:
            self._lent.append(backend)
            self.built += 1
        return backend

    def _forget(self, backend: object) -> None:
        with self._cond:
            _pop(self._lent, backend)
        self._kind.abandon(backend)

    def _create(self) -> object:
        opts = ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=self._timeout_s)
        opts._devices = [self._kind.gloo_device]
        opts.enable_reconfigure = True  # connects at its first reconfigure
        with self._cond:
            client = self._clients.pop() if self._clients else None
        bootstrap = PrefixStore(BOOTSTRAP_PREFIX, client if client is not None else self._connect())
        return ProcessGroupGloo(bootstrap, self.rank, self.world_size, opts)


def _pop(backends: list[object], backend: object) -> bool:
    """Remove ``backend`` (by identity) from ``backends``; True if it was there."""
    for i, b in enumerate(backends):
        if b is backend:
            del backends[i]
            return True
    return False
