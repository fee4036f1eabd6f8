"""torch's reconfigure API on the ``"foldplane"`` backend (torch >= 2.14; docs/reconfigure.md).

torch 2.14 lets a group's new members change it together: each calls
``pg.reconfigure(ReconfigureOptions(uuid, handles))`` with the same fresh uuid and the same
handles (``pg.get_reconfigure_handle()`` of each member; a list orders the new ranks by
position), and the ranks left out do not call. Both foldplane groups answer it, and a
reconfigure never stays between the processes: the agent sends each member's call to the
coordinator, where the calls of one uuid are one proposal and the change one committed view
(``coordinator/fold/reconfigure.py``). The groups differ in what a rank is:

- :class:`~agent.dataplane.group.ElasticProcessGroup`, foldplane's model (the default): ranks are
  global, ``size()`` is the world size, the view's members are its active ranks. A reconfigure
  makes the members the active ranks of a new view; ranks stay global (the handles' order is
  kept in the view, for the record).
- :class:`ReconfigurableProcessGroup`, torch's model (``init_process_group("foldplane",
  enable_reconfigure=True)``, ``agent.process_group(reconfigure=True)``): a process's rank is
  its position among the handles of the last reconfigure it took part in, its size their
  number; its collectives run on a backend built for that configuration, and raise before its
  first reconfigure. A process changes configuration only by its own reconfigure (as in torch,
  a rank left out is not told), so disjoint configurations (one per process, or {0} beside
  {1, 2}) follow from successive views.

A handle is ``foldplane:<group>:<rank>:<incarnation>``: the group, the global rank and the
incarnation of the process that made it, so the coordinator refuses a handle of a process that
has gone (naming both incarnations). Bad arguments raise at the call (``ValueError``,
``TypeError``); what the coordinator decides comes through the returned ``Work``, whose
``wait()`` raises :class:`ReconfigureError` when the reconfigure did not take effect (the
process keeps its configuration; call again with a fresh uuid).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import Store
from torch.distributed import distributed_c10d as _c10d

from .backend import BackendKind, end_gloo_operations
from .errors import DataPlaneError, ReconfigureError

log = logging.getLogger(__name__)

#: torch gives Python groups the reconfigure API from 2.14 (``ReconfigureOptions``).
SUPPORTED = hasattr(_c10d, "ReconfigureOptions")
HANDLE_PREFIX = "foldplane:"
#: torch's ``ReconfigureOptions.uuid`` is a signed 64-bit integer.
_INT64 = (-(2**63), 2**63)


@dataclass(frozen=True)
class Handle:
    """Who a reconfigure handle names: a rank of a group, as one incarnation (one process)."""

    group: str
    rank: int
    incarnation: str

    def __str__(self) -> str:
        return f"{HANDLE_PREFIX}{self.group}:{self.rank}:{self.incarnation}"

    @classmethod
    def parse(cls, text: object) -> Handle:
        """The handle ``text`` names; ``ValueError`` (``TypeError`` for a non-string) naming it
        and the shape a handle has."""
        if not isinstance(text, str):
            raise TypeError(f"a reconfigure handle is a string, got {type(text).__name__}")
        shape = "foldplane:<group>:<rank>:<incarnation>, as get_reconfigure_handle() returns"
        if not text.startswith(HANDLE_PREFIX):
            raise ValueError(f"reconfigure handle {text!r} is not a foldplane handle ({shape})")
        group, _, rest = text[len(HANDLE_PREFIX) :].partition(":")
        rank, _, incarnation = rest.partition(":")
        if not group or not incarnation or not (rank.isascii() and rank.isdigit()):
            raise ValueError(f"reconfigure handle {text!r} is malformed ({shape})")
        return cls(group, int(rank), incarnation)


class Member(Protocol):
    """What a group needs of its agent to reconfigure (``agent.Agent``)."""

    group: str
    rank: int
    incarnation: str

    def reconfigure(
        self, uuid: int, members: Sequence[tuple[int, str]], *, timeout_s: float | None = None
    ) -> Any: ...


class ReconfigurePlane(Protocol):
    """What a reconfigure needs of the data plane (``agent.dataplane.plane.DataPlane``)."""

    rank: int
    world_size: int
    incarnation: str
    kind: BackendKind
    closed: threading.Event

    @property
    def backend_timeout_s(self) -> float: ...

    def rendezvous_store(self) -> AbstractContextManager[Store]: ...

    def serve_configurations(self) -> None: ...

    def claim_view(
        self, version: int, members: Sequence[int], deadline: float
    ) -> dict[str, object]: ...


@dataclass(frozen=True)
class Request:
    """One reconfigure call, checked: its uuid, the members' handles in order, its timeout."""

    uuid: int
    handles: tuple[Handle, ...]
    timeout_s: float | None

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(h.rank for h in self.handles)


def read_request(opts: Any, me: Handle, world_size: int) -> Request:
    """Check ``opts`` (torch's ``ReconfigureOptions``) as ``me``'s call; the first thing wrong
    raises ``ValueError`` (``TypeError`` for a wrong type) naming it."""
    uuid = opts.uuid
    if isinstance(uuid, bool) or not isinstance(uuid, int) or not _INT64[0] <= uuid < _INT64[1]:
        raise TypeError(f"reconfigure uuid must be a signed 64-bit integer, got {uuid!r}")
    given = opts.handles
    if isinstance(given, Set):
        # a set lets the backend choose the order: global rank order
        handles = sorted((Handle.parse(h) for h in given), key=lambda h: h.rank)
    elif isinstance(given, Sequence) and not isinstance(given, str):
        handles = [Handle.parse(h) for h in given]
    else:
        raise TypeError(f"reconfigure handles must be a list or a set, got {type(given).__name__}")
    if not handles:
        raise ValueError("reconfigure needs at least one handle (this rank's own)")
    seen: dict[int, Handle] = {}
    for h in handles:
        if h.group != me.group:
            raise ValueError(
                f"reconfigure handle {str(h)!r} belongs to group {h.group!r}, not to this "
                f"group {me.group!r}"
            )
        if not 0 <= h.rank < world_size:
            raise ValueError(
                f"reconfigure handle {str(h)!r} names rank {h.rank}, not in 0..{world_size - 1}"
            )
        if h.rank in seen:
            raise ValueError(
                f"rank {h.rank} is named twice among the handles: {str(seen[h.rank])!r} and "
                f"{str(h)!r}"
            )
        seen[h.rank] = h
    own = seen.get(me.rank)
    if own is None:
        raise ValueError(
            f"this rank ({me.rank}) is not among the handles {[str(h) for h in handles]}: a "
            "rank that a reconfigure leaves out does not call it"
        )
    if own.incarnation != me.incarnation:
        raise ValueError(
            f"the handle of rank {me.rank} names incarnation {own.incarnation}, but this "
            f"process is incarnation {me.incarnation}"
        )
    timeout = opts.timeout
    timeout_s = None if timeout is None else timeout.total_seconds()
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"reconfigure timeout must be positive, got {timeout!r}")
    return Request(uuid, tuple(handles), timeout_s)


class ReconfigureWork(dist.Work):
    """The ``Work`` a reconfigure returns: done once the configuration is taken (the view
    committed and, in torch's model, its backend built); ``wait()`` raises
    :class:`ReconfigureError` when the reconfigure did not take effect."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        self._done = threading.Event()
        self._error: ReconfigureError | None = None
        self._future: torch.futures.Future | None = None
        self._lock = threading.Lock()

    def _finish(self, error: ReconfigureError | None) -> None:
        with self._lock:
            self._error = error
            self._done.set()
            future = self._future
        if future is not None:
            _complete(future, error)

    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """True once the configuration is taken; raises ``ReconfigureError`` if it was not,
        ``TimeoutError`` if ``timeout`` (seconds or a ``timedelta``; zero: no bound) passed."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds() or None
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.what} was not done within {timeout} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> ReconfigureError | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return []

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """Completes with ``[]`` once the configuration is taken, or with the error."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done.is_set():
                    _complete(self._future, self._error)
            return self._future


def _complete(future: torch.futures.Future, error: ReconfigureError | None) -> None:
    if error is None:
        future.set_result([])
    else:
        future.set_exception(error)


class Reconfigurable:
    """torch's reconfigure API, for both foldplane groups (a mixin of ``dist.ProcessGroup``
    subclasses). The group supplies its plane and agent, and what taking a committed
    configuration means to it (:meth:`_take`)."""

    agent: Member | None

    @property
    def _reconfigure_plane(self) -> ReconfigurePlane:
        raise NotImplementedError

    @property
    def supports_reconfigure(self) -> bool:
        """True on torch >= 2.14 for a group with an agent (a coordinator to go through)."""
        return SUPPORTED and self.agent is not None

    def get_reconfigure_handle(self) -> str:
        """This process's handle: ``foldplane:<group>:<rank>:<incarnation>``."""
        return str(self._own_handle())

    def reconfigure(self, opts: Any) -> ReconfigureWork:
        """torch's ``ProcessGroup.reconfigure``: this member's call, sent to the coordinator in
        the background. Bad arguments raise now; the returned ``Work`` says the rest."""
        me = self._own_handle()
        plane = self._reconfigure_plane
        request = read_request(opts, me, plane.world_size)
        work = ReconfigureWork(
            f"reconfigure uuid {request.uuid} (rank {me.rank}, members {list(request.ranks)})"
        )
        threading.Thread(
            target=self._reconfigure_in_background,
            args=(request, work),
            name=f"foldplane-reconfigure-{request.uuid}",
            daemon=True,
        ).start()
        return work

    def _own_handle(self) -> Handle:
        if not SUPPORTED:
            raise RuntimeError(
                f"torch {torch.__version__} has no reconfigure API (torch >= 2.14 has it)"
            )
        agent = self.agent
        if agent is None:
            raise RuntimeError(
                "this foldplane group has no agent, so no coordinator to reconfigure through: "
                "make it with agent.process_group() or dist.init_process_group('foldplane')"
            )
        plane = self._reconfigure_plane
        return Handle(agent.group, plane.rank, plane.incarnation)

    def _reconfigure_in_background(self, request: Request, work: ReconfigureWork) -> None:
        agent = self.agent
        assert agent is not None
        members = [(h.rank, h.incarnation) for h in request.handles]
        try:
            view = agent.reconfigure(request.uuid, members, timeout_s=request.timeout_s)
            self._take(view, request)
        except ReconfigureError as e:
            work._finish(e)
        except Exception as e:  # the agent stopped, the data plane closed, a build failed
            work._finish(ReconfigureError("failed", f"{type(e).__name__}: {e}"))
        else:
            work._finish(None)

    def _take(self, view: Any, request: Request) -> None:
        """Take the configuration that view ``view`` committed for ``request``."""
        raise NotImplementedError


# -- torch's model ------------------------------------------------------------------------------


@dataclass
class Configuration:
    """The configuration of the last reconfigure this process took part in: view ``version``
    made it, ``members`` are global ranks in handle order, this process is at ``position``."""

    version: int
    uuid: int
    members: tuple[int, ...]
    position: int
    backends: dict[str, object]
    aborted: bool = False


#: The group's own entry points that run on the configuration's backend, by name. Each takes
#: its arguments as torch's backends do (``dist.*`` passes them so): the ranks are the
#: configuration's.
FORWARDED = (
    "allreduce",
    "allreduce_coalesced",
    "allreduce_sparse",
    "allgather",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "_allgather_base",
    "all_gather_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
    "_start_coalescing",
    "_end_coalescing",
)


def _device_type(args: tuple[Any, ...]) -> str:
    """The device of the first tensor (or device) among an operation's arguments."""
    stack: list[Any] = list(args)
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            return item.device.type
        if isinstance(item, torch.device):
            return item.type
        if isinstance(item, list | tuple):
            stack[:0] = list(item)
    return "cpu"


#: Entry points torch 2.14's C++ calls by another name than the backend's.
RENAMED = {"start_coalescing": "_start_coalescing", "end_coalescing": "_end_coalescing"}


def _forward(name: str) -> Callable[..., Any]:
    target = RENAMED.get(name, name)

    def run(self: ReconfigurableProcessGroup, *args: Any, **kwargs: Any) -> Any:
        backend = self._backend_for(name, _device_type(args))
        return getattr(backend, target)(*args, **kwargs)

    run.__name__ = name
    run.__doc__ = f"``{name}`` on this process's configuration (torch's model)."
    return run


class ReconfigurableProcessGroup(Reconfigurable, dist.ProcessGroup):
    """torch's model of a reconfigurable group, over the coordinator (see the module doc).

    ``rank()``/``size()`` (and so ``dist.get_rank()``/``get_world_size()``) are this process's
    position among the handles of its last reconfigure and their number; before the first, the
    global rank and the world size. Collectives take the configuration's ranks and run on a
    backend built for it (gloo; NCCL too for CUDA tensors on a ``"nccl"`` data plane); before
    the first reconfigure, and after :meth:`abort` until the next one, they raise
    ``DataPlaneError``. A peer's failure fails an operation as torch's backends fail it
    (an error, or the backend's timeout: the agent's collective timeout); the members then
    reconfigure with a fresh uuid and the handles they have left.
    """

    def __init__(self, plane: ReconfigurePlane, agent: Member | None) -> None:
        super().__init__(plane.rank, plane.world_size)
        self._plane = plane
        self.agent = agent
        plane.serve_configurations()  # the views of its reconfigures keep their backends for it
        self._group_name = ""
        self._config: Configuration | None = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    @property
    def _reconfigure_plane(self) -> ReconfigurePlane:
        return self._plane

    # -- what c10d asks of every process group ------------------------------------------------

    def getRank(self) -> int:  # noqa: N802 (c10d's name)
        config = self._config
        return self._plane.rank if config is None else config.position

    def getSize(self) -> int:  # noqa: N802
        config = self._config
        return self._plane.world_size if config is None else len(config.members)

    def getBackendName(self) -> str:  # noqa: N802
        return "foldplane"

    def name(self) -> str:  # type: ignore[override]
        return "foldplane"

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    # -- the configuration ----------------------------------------------------------------------

    @property
    def configuration(self) -> Configuration | None:
        """The configuration this process took last (None before its first reconfigure)."""
        return self._config

    @property
    def members(self) -> tuple[int, ...]:
        """The global ranks of the configuration, in order (position = rank here)."""
        config = self._config
        return () if config is None else config.members

    def _take(self, view: Any, request: Request) -> None:
        """Take the backends the data plane built for view ``view`` (every member built them
        as the view committed, numbered in handle order: one backend per reconfigure) and make
        them this process's configuration, unless a newer one was taken meanwhile."""
        plane = self._plane
        members = request.ranks
        position = members.index(plane.rank)
        version = int(view.version)
        timeout_s = request.timeout_s or plane.backend_timeout_s
        try:
            backends = plane.claim_view(version, members, time.monotonic() + timeout_s)
        except DataPlaneError as e:
            raise ReconfigureError(
                "build_failed",
                f"version {version} committed, but its backend (rank {position} of "
                f"{len(members)}) is not there: {e}",
            ) from None
        config = Configuration(version, request.uuid, members, position, backends)
        with self._lock:
            old = self._config
            if self._closed or (old is not None and old.version >= version):
                old, config = config, None  # a newer configuration was taken: drop this one
            else:
                self._config = config
        if old is not None:
            _release(plane.kind, old.backends, old.position, len(old.members))
        log.info(
            "rank %d: reconfigure uuid %d took version %d: rank %d of %d (members %s)",
            plane.rank,
            request.uuid,
            version,
            position,
            len(members),
            list(members),
        )

    def _backend_for(self, op: str, device_type: str) -> object:
        config = self._config
        if config is None:
            raise DataPlaneError(
                f"{op} on rank {self._plane.rank}: this group (torch's reconfigure model) has no "
                "configuration yet; call reconfigure(uuid, handles) first, as with torch's "
                "enable_reconfigure"
            )
        if config.aborted:
            raise DataPlaneError(
                f"{op} on rank {self._plane.rank}: the configuration of version {config.version} "
                "was aborted; reconfigure with a fresh uuid"
            )
        backend = config.backends.get(device_type)
        if backend is None:
            raise ValueError(
                f"{op}: {device_type} tensors are not served by this group's "
                f"{self._plane.kind.name!r} data plane"
            )
        return backend

    def _get_backend(self, device: object) -> object:
        """The configuration's backend for ``device`` (``dist.get_backend_impl``,
        ``dist.batch_isend_irecv``): the one ``_take`` built, so each reconfigure gives
        another; ``DataPlaneError`` (a ``RuntimeError``) before the first."""
        return self._backend_for("_get_backend", torch.device(device).type)  # type: ignore[arg-type]

    def abort(self) -> None:
        """End this configuration (torch's revoke): its operations in flight end with an error
        and later ones raise until the next reconfigure, which recovers with a fresh uuid."""
        with self._lock:
            config = self._config
            if config is None or config.aborted:
                return
            config.aborted = True
        _release(self._plane.kind, config.backends, config.position, len(config.members))

    def shutdown(self) -> None:  # type: ignore[override]
        """Release the configuration's backends (``dist.destroy_process_group``, ``close``)."""
        with self._lock:
            self._closed = True
            config, self._config = self._config, None
        if config is not None and not config.aborted:
            _release(self._plane.kind, config.backends, config.position, len(config.members))

    close = shutdown


for _name in (*FORWARDED, *RENAMED):
    setattr(ReconfigurableProcessGroup, _name, _forward(_name))


def _release(kind: BackendKind, backends: dict[str, object], index: int, size: int) -> None:
    """Stop using a configuration's backends: end what runs on gloo, then release them."""
    for device_type, backend in backends.items():
        if device_type == "cpu" and size > 1:
            with contextlib.suppress(RuntimeError):
                end_gloo_operations(backend, index, size)
        kind.abandon(backend)
    backends.clear()


def _shutdown_at_exit(ref: weakref.ref[ReconfigurableProcessGroup]) -> None:
    """Shut a group the program left open down: its backends must go before the interpreter,
    as the data plane's do (registered after its data plane's, so it runs first)."""
    group = ref()
    if group is not None:
        group.shutdown()
