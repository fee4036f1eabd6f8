"""One gloo backend for every view: torch's reconfigure under the data plane (torch >= 2.14).

The fresh path (:mod:`agent.dataplane.backend`) builds a new ``ProcessGroupGloo`` for each view.
With ``DataPlane(gloo_reconfigure=True)`` (or ``FOLDPLANE_GLOO_RECONFIGURE=1``) a rank keeps one
``ProcessGroupGloo`` built with ``enable_reconfigure=True`` per store session, and each view it
is active in reconfigures it, in three steps that every member takes alike:

1. it publishes the backend's current handle under ``gloo-handle/<v>/<rank>``: a gloo handle
   names the backend's rank and uuid of its last reconfigure, so it changes with each one;
2. it reads the members' handles, in view-rank order (the order of ``ViewGroup.members``);
3. it calls ``reconfigure(uuid, handles)`` with :func:`view_uuid` of the view: gloo then
   rendezvouses on the backend's bootstrap store (this rank's own client of the coordinator's
   store, under ``gloo/``) in ``reconfigure/<uuid>/``, and refuses a uuid used before there.

A backend is lent to one view at a time. The view gives it back when it lets its backend go
(retired with nothing in flight, or when its last operation ends); the operations of a failed
view this rank moved on from are ended (:func:`agent.dataplane.backend.end_gloo_operations`) as
soon as both are true, so a survivors' view gets the backend back within milliseconds of the
failure being known. The next view waits up to ``RETURN_WAIT_S`` for a lent backend; past that
(a superseded view that did not fail runs a long operation), or after a failed reconfigure
(gloo leaves the backend's state undefined), it gets a new reconfigurable backend, and the old
one is released like any abandoned backend.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
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
#: how long a view waits for the backend a superseded view still runs an operation on
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
    """This rank's reconfigurable gloo backend of one store session (see the module doc).

    ``bootstrap`` connects the backend's own store client (it must outlive every reconfigure:
    gloo keeps it). ``built`` and ``reconfigured`` count backends made and reconfigures done.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        kind: BackendKind,
        bootstrap: Store,
        timeout_s: float,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._kind = kind
        self._bootstrap = PrefixStore(BOOTSTRAP_PREFIX, bootstrap)
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._idle: object | None = None  # ready to be lent
        self._lent: object | None = None  # lent to a view
        self._closed = False
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
        """A view lets ``backend`` go: the lent one becomes idle (the next view reconfigures
        it); any other (forgotten, or of a closed session) is released."""
        if backend is None:
            return
        with self._cond:
            mine = backend is self._lent and not self._closed
            if mine:
                self._idle, self._lent = backend, None
                self._cond.notify_all()
        if not mine:
            self._kind.abandon(backend)

    def hand_over(self, backend: object) -> None:
        """The lent ``backend`` leaves for good (torch's model took a view's backend): the next
        view gets a new one."""
        with self._cond:
            if backend is self._lent:
                self._lent = None
                self._cond.notify_all()

    def close(self) -> None:
        """The session ends: release the idle backend; a lent one is released when given back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, None
            self._lent = None
            self._cond.notify_all()
        self._kind.abandon(idle)

    def _borrow(self, timeout_s: float) -> object:
        stale = None
        with self._cond:
            if self._closed:
                raise RuntimeError("the data plane's store session is closed")
            if timeout_s != self._timeout_s:  # the backend's own timeout is set at its creation
                self._timeout_s, stale, self._idle = timeout_s, self._idle, None
        self._kind.abandon(stale)
        with self._cond:
            if self._idle is None and self._lent is not None:
                # a superseded view still runs an operation on it: a failed one's are ended
                # (within milliseconds once it is known to have failed), another's may finish
                self._cond.wait_for(lambda: self._lent is None or self._closed, RETURN_WAIT_S)
            if self._idle is not None:
                backend, self._idle = self._idle, None
                self._lent = backend
                return backend
            # none yet, or the one there is still lent: a new one (the lent one is then
            # released when its view gives it back)
            self._lent = None
        backend = self._create()
        with self._cond:
            self._lent = backend
            self.built += 1
        return backend

    def _forget(self, backend: object) -> None:
        with self._cond:
            if backend is self._lent:
                self._lent = None
        self._kind.abandon(backend)

    def _create(self) -> object:
        opts = ProcessGroupGloo._Options()
        opts._timeout = timedelta(seconds=self._timeout_s)
        opts._devices = [self._kind.gloo_device]
        opts.enable_reconfigure = True  # connects at its first reconfigure
        return ProcessGroupGloo(self._bootstrap, self.rank, self.world_size, opts)
