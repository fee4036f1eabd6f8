"""The agent's host: the threads, the clock and the HTTP that run ``AgentMachine``.

The loop reads like etcd raft's: take the next input (or a ``Tick`` when the machine's deadline
passes), ``step`` the machine, carry out the actions. One *driver* thread owns the machine and
the data plane; it never blocks on the network. Two helpers do the blocking I/O and hand their
results back to the driver as inputs:

- the *sender* POSTs each ``SendEvents`` batch to ``/agents/events``;
- the *poller* long-polls ``/agents/updates`` after the offset each ``PollUpdates`` names, so a
  reconnect resumes exactly after the last update the machine processed.

The data plane's link evidence arrives from its own thread and is queued the same way. The user
facing ``Agent`` reads ``view`` and the rank's state from what the driver published, under one
condition variable, so ``wait_for_view`` wakes on change instead of polling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ..wire.codes import (
    APPLIED,
    APPLIED_STATUSES,
    APPLIED_WITH_DROPPED_RANKS,
    COORDINATOR_UNAVAILABLE,
    FATAL_ERRORS,
    NOT_FOLDPLANE,
    REJECTED,
    TERMINAL,
    error_body,
)
from . import facets
from .client import (
    START_LOG_EVERY_S,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailable,
    start_timeout_s,
)
from .driver import Driver
from .events import ANSWER_S, EventAnswers, event_fields
from .facets import FACETS_ENV, FacetWorker, WorkerSide, deployment_facets, worker_parts
from .machine import (
    BEATS,
    EVENTS,
    OFFLINE,
    Action,
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
    RankStateChanged,
    Rejoin,
    SendEvent,
    SendEvents,
    ShutdownWithSave,
    Start,
    Stopped,
    StoreAddress,
    Tick,
    UpdatesReceived,
    View,
)

log = logging.getLogger("foldplane.agent")

#: How long one long poll waits on the coordinator before answering empty.
POLL_TIMEOUT_S = 10.0
#: While the data plane is not ready yet, how often the driver looks again.
READY_POLL_S = 0.01
#: After a failed move to another store, how long before the driver tries again.
MOVE_RETRY_S = 1.0

ViewPredicate = Callable[[View], bool]


class AgentStopped(RuntimeError):
    """The agent stopped (fenced by a newer incarnation, refused, or closed)."""


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def default_backend() -> str:
    """``"nccl"`` where CUDA is available (CUDA tensors through NCCL, CPU tensors through gloo,
    as torch's default ``"cpu:gloo,cuda:nccl"`` group), ``"gloo"`` otherwise."""
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


class Agent:
    """The agent inside one worker process: speaks for ``(group, rank)`` to the coordinator.

    Arguments left out come from the environment (set by ``python -m foldplane.agent.launch``):
    ``FOLDPLANE_COORDINATOR`` (comma-separated URLs), ``FOLDPLANE_GROUP``, ``FOLDPLANE_RANK``,
    ``FOLDPLANE_TOKEN`` (this rank's agent token) and ``FOLDPLANE_INCARNATION`` (otherwise a
    new uuid: a restarted process is a new incarnation). The world size comes from the group.
    With ``FOLDPLANE_RELAY`` set, events and updates go through that per-host relay.
    """

    def __init__(
        self,
        coordinator: str | Sequence[str] | None = None,
        *,
        group: str | None = None,
        rank: int | None = None,
        token: str | None = None,
        incarnation: str | None = None,
        backend: str | None = None,
        device: Any = None,
        heartbeat_interval_s: float = 1.0,
        collective_timeout_s: float = 30.0,
        p2p_timeout_s: float = 30.0,
        on_shutdown_with_save: Callable[[str, str], None] | None = None,
    ) -> None:
        coordinator = coordinator or _env("FOLDPLANE_COORDINATOR")
        group = group or _env("FOLDPLANE_GROUP")
        env_rank = _env("FOLDPLANE_RANK")
        if rank is None and env_rank is not None:
            if not env_rank.isdigit():
                raise ValueError(f"FOLDPLANE_RANK={env_rank!r} is not a non-negative integer")
            rank = int(env_rank)
        missing = [
            name
            for name, value in (
                ("coordinator (or FOLDPLANE_COORDINATOR)", coordinator),
                ("group (or FOLDPLANE_GROUP)", group),
                ("rank (or FOLDPLANE_RANK)", rank),
            )
            if value is None
        ]
        if missing:
            raise ValueError(f"Agent needs {', '.join(missing)}")
        assert coordinator is not None and group is not None and rank is not None
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank {rank!r} must be a non-negative integer")
        self.group = group
        self.rank = rank
        self.incarnation = incarnation or _env("FOLDPLANE_INCARNATION") or uuid.uuid4().hex
        self.world_size: int | None = None
        #: the group's configuration as the coordinator answered it at ``start``
        self._group_config: dict[str, Any] = {}
        self.on_shutdown_with_save = on_shutdown_with_save
        self._shutdown_directive: ShutdownWithSave | None = None
        token = token or _env("FOLDPLANE_TOKEN")
        self._backend = backend
        self._device = device
        #: an explicit backend="nccl" builds NCCL with every view; the default on a GPU host
        #: builds it at the first CUDA tensor (a CPU-only job on a GPU host never starts NCCL)
        self._eager_cuda = backend == "nccl"
        self._collective_timeout_s = collective_timeout_s
        self._p2p_timeout_s = p2p_timeout_s
        self._machine = AgentMachine(
            AgentConfig(
                group=group,
                rank=rank,
                incarnation=self.incarnation,
                heartbeat_interval_s=heartbeat_interval_s,
            )
        )
        # One client per thread that blocks on the network: operator calls from the user's
        # thread, event batches, and the long poll (closing its client aborts a poll).
        # Events and updates go through the launcher's per-host relay when it runs one.
        channel = _env("FOLDPLANE_RELAY") or coordinator
        self._ops = CoordinatorClient(coordinator, token=token)
        self._sender_client = CoordinatorClient(channel, token=token)
        self._beater_client = CoordinatorClient(channel, token=token)
        self._poller_client = CoordinatorClient(channel, token=token)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._to_send: queue.Queue[SendEvents | None] = queue.Queue()
        self._to_beat: queue.Queue[SendEvents | None] = queue.Queue()
        self._to_poll: queue.Queue[PollUpdates | None] = queue.Queue()
        self._changed = threading.Condition()
        self._view: View | None = None
        #: whether this incarnation is one of the active members of ``_view`` (``is_active``)
        self._view_member = False
        self._state = OFFLINE
        self._stopped: Stopped | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._data_plane: Any = None
        #: the group of torch's reconfigure model (``process_group(reconfigure=True)``)
        self._reconfigurable: Any = None
        self._data_plane_error: BaseException | None = None
        #: a view to install once the data plane is on the store, and whether this rank is
        #: one of its members (``InstallView.member``)
        self._pending_view: tuple[View, bool] | None = None
        #: the store the data plane is on (address and id)
        self._plane_store: StoreAddress | None = None
        self._move_retry_at: float | None = None
        self._started = False
        #: who follows which facet's updates (:meth:`on_update`), by the update's Struct: each
        #: facet's worker part its own, and whoever a caller names
        self._followers: dict[type, list[Callable[[Any], None]]] = {}
        #: the facets' worker parts (``agent/facets.py``): those of foldplane and of the
        #: deployment's own facets (``FOLDPLANE_FACETS``), by facet name; each made when its
        #: first update comes or when first asked for (:meth:`facet`)
        self._parts = {
            part.name: part
            for part in (
                *facets.WORKER_PARTS,
                *worker_parts(deployment_facets(_env(FACETS_ENV))),
            )
        }
        self._workers: dict[str, FacetWorker] = {}
        self._workers_made = threading.Lock()
        #: the name the Agent answers for a worker part (``agent.refit``), by that name
        self._offered = {name: part.name for part in self._parts.values() for name in part.offers}
        #: the facet whose worker part alone sends an event kind and is given its answers
        self._answered_by = {
            e.__struct_config__.tag: part.name for part in self._parts.values() for e in part.events
        }
        for part in self._parts.values():
            for struct in part.updates:
                self.on_update(
                    struct, lambda update, name=part.name: self.facet(name).on_update(update)
                )
        #: the answers to the facets' events its callers send (:meth:`send_event`)
        self._events = EventAnswers(self._send_event)
        #: the Struct of each facet's event kind this agent sends (``send_event``, and the
        #: worker parts' of a deployment's facets)
        self._event_types: dict[str, type] = {
            e.__struct_config__.tag: e for part in self._parts.values() for e in part.events
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout_s: float | None = None) -> Agent:
        """Look the group up, then join, heartbeat and follow updates in the background.

        Waits up to ``timeout_s`` (default ``FOLDPLANE_START_TIMEOUT_S``, else
        :data:`DEFAULT_START_TIMEOUT_S`) for the coordinator to answer and the group to exist (a
        worker may start before the operator creates it), saying every few seconds what it
        waits for; then raises naming the address and the group: "no foldplane coordinator at
        URL" or "no group NAME (groups: ...)". An address that answers but is not a foldplane
        coordinator fails at once.
        """
        if self._started:
            return self
        self.world_size = self._lookup_world_size(start_timeout_s(timeout_s))
        if self.rank >= self.world_size:
            raise ValueError(
                f"rank {self.rank} is out of range for group {self.group!r} "
                f"(world_size {self.world_size}: ranks 0..{self.world_size - 1})"
            )
        if self._backend is None:
            self._backend = default_backend()
        self._machine.config = dataclasses.replace(self._machine.config, world_size=self.world_size)
        self._started = True
        for name, target, args in (
            ("driver", self._drive, ()),
            ("sender", self._send_loop, (self._to_send, self._sender_client, EVENTS)),
            ("beater", self._send_loop, (self._to_beat, self._beater_client, BEATS)),
            ("poller", self._poll_loop, ()),
        ):
            thread = threading.Thread(
                target=target, args=args, name=f"foldplane-agent-{self.rank}-{name}", daemon=True
            )
            self._threads.append(thread)
        self._inbox.put(Start(time.monotonic()))
        for thread in self._threads:
            thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Leave the group cleanly (``exit``: never counted as a failure) and stop the threads."""
        if self._started and self._stopped is None:
            self._inbox.put(Close(time.monotonic()))
            with self._changed:
                self._changed.wait_for(lambda: self._stopped is not None, timeout_s)
        self._shutdown()
        if self._reconfigurable is not None:
            self._reconfigurable.shutdown()
        if self._data_plane is not None:
            self._data_plane.close()
        self._ops.close()

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rejoin(self) -> None:
        """Join again in place (same process and incarnation), with fresh link evidence."""
        self._inbox.put(Rejoin(time.monotonic()))

    # -- what the coordinator said ---------------------------------------------------------------

    @property
    def view(self) -> View | None:
        """The latest committed view this agent has seen (None before formation)."""
        return self._view

    @property
    def state(self) -> str:
        """This rank's physical state as the coordinator last reported it."""
        return self._state

    @property
    def checkpoint_rank(self) -> int | None:
        """The rank that saves the group's checkpoints: the one the latest committed view
        names (the operator's pin while it is active and alive, else the lowest active rank;
        after a death the next view names the next one), or, once the group was told to shut
        down, the one that directive names. None before the first view."""
        shutdown = self._shutdown_directive
        if shutdown is not None and shutdown.checkpoint_rank is not None:
            return shutdown.checkpoint_rank
        view = self._view
        return None if view is None else view.checkpoint_rank

    def is_active(self) -> bool:
        """Whether this process is an active member of the latest committed view: the view
        lists its rank and was committed after this incarnation joined. A replacement that
        starts before the coordinator has seen the death of the process it replaces first
        reads a view that lists its rank for that process: it is not active in it, and asks
        to be activated (``activate_ranks([rank])``) like any replacement."""
        with self._changed:
            return self._view is not None and self._view_member

    def is_checkpoint_rank(self) -> bool:
        """Whether this rank saves the group's checkpoints (``checkpoint_rank``): the elastic
        form of ``if rank == 0: save(...)``, which nobody runs once rank 0 has died."""
        return self.checkpoint_rank == self.rank

    @property
    def shutdown_directive(self) -> ShutdownWithSave | None:
        """The group's ``shutdown_with_save`` (reason, detail, checkpoint rank), once received."""
        return self._shutdown_directive

    @property
    def data_plane(self) -> Any:
        """The ``DataPlane`` (None until the store's address is known), for fault injection."""
        return self._data_plane

    @property
    def stopped(self) -> Stopped | None:
        """Why the agent stopped (``closed``, ``fenced``, ``failed``), or None while running."""
        return self._stopped

    def wait_for_view(
        self, predicate: ViewPredicate | int | None = None, timeout: float | None = None
    ) -> View:
        """Block until a committed view satisfies ``predicate`` and return it.

        ``predicate`` is a function of the view, a minimum version, or None (any view).
        Raises ``TimeoutError`` naming what it waited for and where things stand, or
        ``AgentStopped`` if the agent stopped first.
        """
        if predicate is None:
            test: ViewPredicate = lambda v: True  # noqa: E731
        elif isinstance(predicate, int):
            min_version = predicate
            test = lambda v: v.version >= min_version  # noqa: E731
        else:
            test = predicate

        def done() -> bool:
            return self._stopped is not None or (self._view is not None and test(self._view))

        with self._changed:
            ok = self._changed.wait_for(done, timeout)
        if self._view is not None and test(self._view):
            return self._view
        if self._stopped is not None:
            raise AgentStopped(
                f"rank {self.rank}: agent {self._stopped.reason}: {self._stopped.detail}"
            )
        assert not ok
        raise TimeoutError(
            f"rank {self.rank} of group {self.group!r}: no committed view matched "
            f"{predicate!r} within {timeout} s; latest view "
            f"{_describe(self._view)}; own state {self._state}; "
            f"last error: {self._machine.last_error or 'none'}"
        )

    def wait_for_state(self, state: str, timeout: float | None = None) -> None:
        """Block until the coordinator reports this rank in ``state`` (e.g. ``HEALTHY``)."""
        with self._changed:
            ok = self._changed.wait_for(
                lambda: self._state == state or self._stopped is not None, timeout
            )
        if self._state == state:
            return
        if self._stopped is not None:
            raise AgentStopped(
                f"rank {self.rank}: agent {self._stopped.reason}: {self._stopped.detail}"
            )
        assert not ok
        raise TimeoutError(
            f"rank {self.rank}: still {self._state} after {timeout} s waiting for {state}; "
            f"last error: {self._machine.last_error or 'none'}"
        )

    # -- proposals -------------------------------------------------------------------------------

    def activate_ranks(
        self, ranks: Sequence[int], *, wait_s: float = 30.0, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Propose adding ``ranks`` to ``active_ranks``; return the terminal proposal.

        Identical proposals from several ranks resolve as one view change, each ``applied``
        with the same version. When applied, this returns once this agent has seen that view.
        """
        return self._propose("activate", ranks, wait_s, idempotency_key)

    recover_ranks = activate_ranks

    def deactivate_ranks(
        self, ranks: Sequence[int], *, wait_s: float = 30.0, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Propose removing ``ranks`` from ``active_ranks``; return the terminal proposal."""
        return self._propose("deactivate", ranks, wait_s, idempotency_key)

    def _propose(
        self, op: str, ranks: Sequence[int], wait_s: float, idempotency_key: str | None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait_s
        proposal = self._ops.propose(
            self.group,
            op,
            [int(r) for r in ranks],
            proposer=f"rank:{self.rank}",
            idempotency_key=idempotency_key,
            wait_s=wait_s,
        )
        version = proposal.get("version")
        if proposal.get("status") in APPLIED_STATUSES and isinstance(version, int):
            left = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                self.wait_for_view(version, timeout=left)
        return proposal

    # -- torch's reconfigure ---------------------------------------------------------------------

    def reconfigure(
        self, uuid: int, members: Sequence[tuple[int, str]], *, timeout_s: float | None = None
    ) -> View:
        """This rank's call of torch's reconfigure: ``members`` are the ``(rank, incarnation)``
        of each member's handle, in handle order; this rank must be one of them. All the
        members' calls of ``uuid`` are one proposal (docs/reconfigure.md); returns the view it
        committed once this agent has seen it, or raises ``ReconfigureError`` naming why it did
        not take effect (a refusal, a rejection, a member lost while the view changed).

        ``timeout_s`` bounds its admission (default: the group's ``admission_timeout_s``); the
        call waits for that, the view change's ACKs, and the coordinator's answers."""
        from .dataplane.errors import ReconfigureError

        config = self._group_config
        admission = timeout_s if timeout_s is not None else config.get("admission_timeout_s", 30.0)
        deadline = time.monotonic() + admission + config.get("ack_timeout_s", 30.0) + 30.0
        fields: dict[str, Any] = {
            "incarnations": [inc for _, inc in members],
            "uuid": int(uuid),
            "caller": self.rank,
            # this call's id: sent again (a lost answer, a long wait), it is the same call; a
            # later reconfigure() with the same uuid is a reused uuid, refused
            "call": os.urandom(12).hex(),
        }
        if timeout_s is not None:
            fields["timeout_s"] = float(timeout_s)
        ranks = [int(r) for r, _ in members]
        proposal: dict[str, Any] = {}
        while True:
            left = deadline - time.monotonic()
            try:
                # The same call sent again is answered with the proposal and appends nothing,
                # so sending it again is how this waits (at most 55 s per request).
                proposal = self._ops.propose(
                    self.group,
                    "reconfigure",
                    ranks,
                    wait_s=max(0.0, min(left, 55.0)),
                    fields=fields,
                )
            except CoordinatorError as exc:
                raise ReconfigureError(exc.code, exc.detail) from None
            except CoordinatorUnavailable as exc:
                if left <= 0:
                    raise ReconfigureError(COORDINATOR_UNAVAILABLE, str(exc)) from None
                self._stop.wait(min(1.0, max(0.0, left)))
                continue
            if proposal.get("status") in TERMINAL or time.monotonic() >= deadline:
                break
        status, version = proposal.get("status"), proposal.get("version")
        if status == APPLIED and isinstance(version, int):
            return self.wait_for_view(version, timeout=max(1.0, deadline - time.monotonic()))
        if status == APPLIED_WITH_DROPPED_RANKS:
            raise ReconfigureError(
                status,
                f"version {version} committed without members "
                f"{proposal.get('dropped_ranks')} (lost before they ACKed): {proposal.get('reason')}",
            )
        if status == REJECTED:
            raise ReconfigureError(status, str(proposal.get("reason")))
        raise ReconfigureError(
            "timeout",
            f"proposal {proposal.get('id')} (reconfigure uuid {uuid}) is still "
            f"{status} after the admission and ACK deadlines",
        )

    # -- the facets' worker parts ------------------------------------------------------------------

    def facet(self, name: str) -> Any:
        """The worker part of facet ``name`` (a module of its folder, ``worker.py``), made
        the first time it is needed: it follows the facet's updates, sends its events and is
        given their answers (``agent/facets.py``)."""
        worker = self._workers.get(name)
        if worker is not None:
            return worker
        part = self._parts.get(name)
        if part is None:
            raise KeyError(f"no facet {name!r} with a worker part (facets: {sorted(self._parts)})")
        with self._workers_made:
            if name not in self._workers:
                side = WorkerSide(self.group, self.rank, self._send_event, self._ops.request)
                self._workers[name] = part.make(side)
            return self._workers[name]

    def __getattr__(self, name: str) -> Any:
        # what a facet's worker part offers as the Agent's own (``agent.refit(name)``), by the
        # names its protocol module declares (``wire.facets.WorkerPart``)
        facet = self.__dict__.get("_offered", {}).get(name)
        if facet is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.facet(facet), name)

    def _send_event(self, kind: str, fields: dict[str, Any]) -> None:
        # a facet's that a caller sent (send_event), or one a facet of foldplane declares
        event_type = self._event_types.get(kind) or facets.EVENTS.types.get(kind)
        self._inbox.put(SendEvent(time.monotonic(), kind, fields, event_type))

    # -- a facet's updates and events ------------------------------------------------------------

    def send_event(
        self, event_type: type, *, timeout: float = ANSWER_S, **fields: Any
    ) -> int | None:
        """Send an event of a facet beside membership (``event_type``: its Struct, a
        ``wire.protocol.AgentEventBase`` the facet declares; ``fields``: all but the envelope,
        which the agent fills) and wait for the coordinator's answer: the offset of its record.
        Sent while the agent is still joining, it goes once the join is appended (all within
        ``timeout``). A refusal raises ``agent.events.EventRefused`` with the fold's code and
        reason and never ends the agent; fields that do not fit the Struct are a ValueError,
        sent nowhere (docs/agent.md; docs/fold.md, "Facets: state beside membership")."""
        envelope = {"group": self.group, "rank": self.rank, "incarnation": self.incarnation}
        payload = event_fields(event_type, fields, envelope, self._answered_by)
        kind = event_type.__struct_config__.tag  # type: ignore[attr-defined]
        self._event_types[kind] = event_type
        return self._events.send(kind, payload, timeout)

    def on_update(self, update_type: type, follow: Callable[[Any], None]) -> None:
        """Call ``follow(update)`` for each update of ``update_type`` the group or this rank
        receives, in offset order, on the agent's own thread: the updates of a facet beside
        membership that this worker follows (its poller reads ``update_type`` from now on)."""
        client = self._poller_client
        client.reader = client.reader.with_types(update_type)
        self._followers.setdefault(update_type, []).append(follow)

    # -- the data plane --------------------------------------------------------------------------

    def process_group(
        self, backend: str | None = None, timeout_s: float = 60.0, *, reconfigure: bool = False
    ) -> Any:
        """The elastic process group over the committed views (one object per process).

        Blocks until the data plane is connected: the store's address comes with the first
        update after the join. The group is a ``torch.distributed.ProcessGroup`` registered
        with torch (the default group when there is none yet), so ``dist.*(..., group=pg)``
        works on it. ``backend="gloo"`` is accepted by a ``"nccl"`` data plane too: it serves CPU
        tensors through gloo in every view.

        ``reconfigure=True``: the group of torch's reconfigure model instead
        (``ReconfigurableProcessGroup``, one per process; docs/reconfigure.md): ranks and size
        follow this process's reconfigures, and its collectives wait for the first.
        """
        if not self._started:
            raise RuntimeError("call agent.start() before agent.process_group()")
        # A "nccl" data plane serves CPU tensors through gloo: asking for gloo is asking for
        # what it already does for them.
        if backend is not None and backend != self._backend and backend != "gloo":
            raise ValueError(
                f"the data plane of rank {self.rank} uses {self._backend!r} "
                f"(Agent(backend=...)); process_group(backend={backend!r}) cannot change it"
            )
        with self._changed:
            self._changed.wait_for(
                lambda: (
                    self._data_plane is not None
                    or self._data_plane_error is not None
                    or self._stopped is not None
                ),
                timeout_s,
            )
        if self._data_plane_error is not None:
            raise RuntimeError(f"rank {self.rank}: the data plane failed to start") from (
                self._data_plane_error
            )
        if self._data_plane is None:
            raise TimeoutError(
                f"rank {self.rank}: no data plane after {timeout_s} s (the store address comes "
                f"with the first update; last error: {self._machine.last_error or 'none'})"
            )
        from .dataplane.c10d import adopt

        if reconfigure:
            from .dataplane.reconfigure import (
                SUPPORTED,
                ReconfigurableProcessGroup,
            )

            if not SUPPORTED:
                import torch

                raise RuntimeError(
                    f"process_group(reconfigure=True) needs torch's reconfigure API (torch >= "
                    f"2.14); this is torch {torch.__version__}"
                )
            with self._changed:
                if self._reconfigurable is None:
                    self._reconfigurable = ReconfigurableProcessGroup(self._data_plane, self)
            return adopt(self._reconfigurable, self)
        return adopt(self._data_plane.process_group(), self)

    # -- the driver ------------------------------------------------------------------------------

    def _drive(self) -> None:
        """The driver thread's loop, etcd raft's ``node.run``: the next input (or a ``Tick``
        when the machine's deadline passes) into the one driver core (``_Driver``)."""
        machine, driver = self._machine, _Driver(self)
        while not self._stop.is_set():
            now = time.monotonic()
            if self._move_retry_at is not None and now >= self._move_retry_at:
                assert machine.store is not None
                self._move_data_plane(machine.store)
            deadline = machine.next_deadline()
            if self._data_plane is not None and machine.awaiting_data_plane:
                deadline = min(deadline or now + READY_POLL_S, now + READY_POLL_S)
            wait = None if deadline is None else max(0.0, deadline - now)
            try:
                event = self._inbox.get(timeout=wait)
            except queue.Empty:
                event = Tick(time.monotonic())
            if event is None:
                break
            driver.feed(event)
            if machine.awaiting_data_plane and self._data_plane_ready():
                driver.feed(DataPlaneReady(time.monotonic()))

    def _on_stopped(self, action: Stopped) -> None:
        log.info("rank %d: agent %s: %s", self.rank, action.reason, action.detail)
        self._publish(stopped=action)
        self._stop.set()
        for worker in list(self._workers.values()):
            worker.on_stopped(f"{action.reason}: {action.detail}")
        self._events.on_stopped(f"{action.reason}: {action.detail}")

    def _connect_data_plane(self, store: StoreAddress) -> None:
        from .dataplane import DataPlane

        assert self.world_size is not None and self._backend is not None
        try:
            self._data_plane = DataPlane(
                self.rank,
                self.world_size,
                store.host,
                store.port,
                incarnation=self.incarnation,
                backend=self._backend,
                device=self._device,
                eager_cuda=self._eager_cuda,
                collective_timeout_s=self._collective_timeout_s,
                p2p_timeout_s=self._p2p_timeout_s,
                on_link_evidence=self._on_link_evidence,
                # One store serves every group of the coordinator: keys must not collide.
                store_prefix=f"{self.group}/",
            )
        except Exception as exc:  # surfaced by process_group()
            log.exception("rank %d: the data plane failed to start", self.rank)
            self._data_plane_error = exc
        else:
            self._data_plane_error = None
            self._plane_store = store
            if self._pending_view is not None:
                self._install(*self._pending_view)
        self._publish()

    def _move_data_plane(self, store: StoreAddress) -> None:
        """Follow the store the coordinator advertises now (it restarted, or another leads).

        Views wait meanwhile (``_install`` keeps the latest); a failed move is tried again every
        ``MOVE_RETRY_S`` while the machine holds the ACKs of views this rank is active in.
        """
        self._move_retry_at = None
        if self._data_plane is None:
            self._connect_data_plane(store)
            return
        try:
            # the same address with another id is another store (a restart on a fixed port)
            self._data_plane.switch_store(store.host, store.port, force=True)
        except Exception as exc:
            log.warning("rank %d: cannot move the data plane: %s", self.rank, exc)
            self._move_retry_at = time.monotonic() + MOVE_RETRY_S
            return
        self._plane_store = store
        if self._pending_view is not None:
            self._install(*self._pending_view)

    def _data_plane_ready(self) -> bool:
        """The data plane is ready, on the store the coordinator advertised last."""
        plane, store = self._data_plane, self._machine.store
        return plane is not None and plane.ready and (store is None or self._plane_store == store)

    def _install(self, view: View, member: bool) -> None:
        store = self._machine.store
        members = list(view.active_ranks)
        if not member and view.is_active(self.rank):
            # the view names the process this one replaced: this one follows it as a rank
            # outside it (a later view, once this rank is activated, takes this one in)
            members.remove(self.rank)
        if self._data_plane is None or (store is not None and self._plane_store != store):
            self._pending_view = (view, member)  # installed once the data plane is on the store
        elif not members:
            pass  # every rank left: there is no group to build
        else:
            self._pending_view = None
            self._data_plane.install_view(view.version, members, _handle_order(view, members))
        self._publish(view=view, member=member)

    def _on_link_evidence(self, version: int, peers: dict[int, str], failed: list[int]) -> None:
        """Called from a data-plane thread: queue it, never block. A failure that blames
        nobody carries the operations this rank had issued and completed on the view."""
        plane = self._data_plane
        blamed = failed or any(status == "down" for status in peers.values())
        ops = None if blamed or plane is None else plane.ops_at_failure(version)
        self._inbox.put(
            LinkEvidence(time.monotonic(), version, dict(peers), tuple(int(r) for r in failed), ops)
        )

    def _shutdown_with_save(self, action: ShutdownWithSave) -> None:
        log.warning(
            "rank %d: shutdown_with_save: %s: %s (checkpoint rank %s)",
            self.rank,
            action.reason,
            action.detail,
            action.checkpoint_rank,
        )
        self._shutdown_directive = action
        callback = self.on_shutdown_with_save
        if callback is not None:
            threading.Thread(
                target=callback, args=(action.reason, action.detail), daemon=True
            ).start()
        plane = self._data_plane
        if plane is not None:  # no view follows: a step on a failed view stops waiting for one
            plane.no_more_views()

    def _publish(
        self,
        *,
        view: View | None = None,
        member: bool = False,
        state: str | None = None,
        stopped: Stopped | None = None,
    ) -> None:
        with self._changed:
            if view is not None:
                self._view, self._view_member = view, member
            if state is not None:
                self._state = state
            if stopped is not None:
                self._stopped = stopped
            self._changed.notify_all()

    # -- the blocking helpers --------------------------------------------------------------------

    def _send_loop(
        self, to_send: queue.Queue[SendEvents | None], client: CoordinatorClient, lane: str
    ) -> None:
        """POST the batches of one lane (events, or heartbeats), one at a time."""
        while True:
            action = to_send.get()
            if action is None or self._stop.is_set():
                return
            try:
                results = client.post_events(action.events)
            except CoordinatorError as exc:
                if exc.code in FATAL_ERRORS:  # the whole batch refused: retrying cannot help
                    refused = error_body(exc.code, str(exc))
                    self._inbox.put(
                        EventsAnswered(time.monotonic(), (refused,) * len(action.events), lane)
                    )
                else:
                    self._inbox.put(EventsFailed(time.monotonic(), str(exc), lane))
            except (CoordinatorUnavailable, OSError) as exc:
                self._inbox.put(EventsFailed(time.monotonic(), str(exc), lane))
            else:
                self._inbox.put(EventsAnswered(time.monotonic(), tuple(results), lane))

    def _poll_loop(self) -> None:
        while True:
            action = self._to_poll.get()
            if action is None or self._stop.wait(action.delay_s):
                return
            try:
                answer = self._poller_client.updates(
                    self.group, self.rank, action.after, POLL_TIMEOUT_S, view=action.view
                )
            except (CoordinatorError, CoordinatorUnavailable, OSError, RuntimeError) as exc:
                if self._stop.is_set():
                    return
                self._inbox.put(PollFailed(time.monotonic(), str(exc)))
                continue
            store = StoreAddress(*answer.store) if answer.store else None
            self._inbox.put(
                UpdatesReceived(
                    time.monotonic(),
                    answer.updates,
                    answer.next_after,
                    store,
                    answer.resync,
                    answer.restored,
                )
            )

    def _shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._to_send.put(None)
        self._to_beat.put(None)
        self._to_poll.put(None)
        self._poller_client.close()  # aborts a long poll in progress
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=2.0)
        self._sender_client.close()
        self._beater_client.close()

    def _lookup_world_size(self, timeout_s: float) -> int:
        where = ",".join(self._ops.addresses)
        started = time.monotonic()
        deadline = started + timeout_s
        next_log = started + START_LOG_EVERY_S
        while True:
            left = deadline - time.monotonic()
            try:
                info = self._ops.group(self.group, timeout_s=max(0.5, min(left, 5.0)))
            except CoordinatorUnavailable as exc:
                waiting = f"no foldplane coordinator at {where} ({exc})"
            except CoordinatorError as exc:
                if exc.code == NOT_FOLDPLANE:
                    raise RuntimeError(f"rank {self.rank}: {exc.detail}") from None
                if exc.status != 404:
                    raise RuntimeError(
                        f"rank {self.rank}: cannot look up group {self.group!r} at {where}: {exc}"
                    ) from exc
                waiting = ""  # the group is missing: named below, with the groups there are
            else:
                ended = info.get("ended")
                if ended:  # nothing joins it again: say so now, not at the first wait
                    how, why = (
                        ("finished", "every rank exited cleanly")
                        if ended.get("finished")
                        else ("was ended", ended.get("reason"))
                    )
                    raise RuntimeError(
                        f"rank {self.rank}: group {self.group!r} at {where} {how} at offset "
                        f"{ended.get('offset')} ({why}); its history stays under its name, so "
                        "run again under another group name"
                    )
                self._group_config = info.get("config") or {}
                size = info.get("world_size", (info.get("config") or {}).get("world_size"))
                if not isinstance(size, int):
                    raise RuntimeError(f"group {self.group!r}: no world_size in {info!r}")
                return size
            now = time.monotonic()
            if not waiting and (now >= deadline or now >= next_log):
                waiting = f"no group {self.group!r} at {where} (groups: {self._group_names()})"
            if now >= deadline:
                raise RuntimeError(
                    f"rank {self.rank}: {waiting} after {timeout_s:g} s; check the coordinator "
                    "address and the group name (FOLDPLANE_COORDINATOR, FOLDPLANE_GROUP or "
                    "the launcher's --coordinator and --group), or wait longer with "
                    "FOLDPLANE_START_TIMEOUT_S"
                )
            if now >= next_log:
                log.warning(
                    "rank %d: waiting for group %r at %s: %s (%.0f of %g s)",
                    self.rank,
                    self.group,
                    where,
                    waiting,
                    now - started,
                    timeout_s,
                )
                next_log = now + START_LOG_EVERY_S
            time.sleep(min(0.2, max(0.0, deadline - now)))

    def _group_names(self) -> str:
        """The coordinator's group names, for a message (``GET /groups``)."""
        try:
            groups = self._ops.groups(timeout_s=2.0)
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            return f"unknown: {exc}"
        names = [str(g.get("group")) for g in groups]
        if not names:
            return "none"
        more = f", ... (+{len(names) - 20} more)" if len(names) > 20 else ""
        return ", ".join(names[:20]) + more


class _Driver(Driver):
    """The agent's machine in the driver every agent host uses (``agent.driver``): each action
    goes to the agent's helper threads, its data plane or whoever follows it."""

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent._machine)
        self.agent = agent

    def failed(self, action: Action, exc: Exception) -> None:
        # the loop must outlive one bad action
        log.exception("rank %d: carrying out %r failed", self.agent.rank, action)

    def send_events(self, action: SendEvents) -> None:
        agent = self.agent
        (agent._to_beat if action.lane == BEATS else agent._to_send).put(action)

    def poll_updates(self, action: PollUpdates) -> None:
        self.agent._to_poll.put(action)

    def connect_data_plane(self, action: ConnectDataPlane) -> None:
        self.agent._connect_data_plane(action.store)

    def move_data_plane(self, action: MoveDataPlane) -> None:
        self.agent._move_data_plane(action.store)

    def install_view(self, action: InstallView) -> None:
        self.agent._install(action.view, action.member)

    def rank_state_changed(self, action: RankStateChanged) -> None:
        self.agent._publish(state=action.state)

    def shutdown_with_save(self, action: ShutdownWithSave) -> None:
        self.agent._shutdown_with_save(action)

    def facet_update(self, action: FacetUpdate) -> None:
        for follow in self.agent._followers.get(type(action.update), ()):
            follow(action.update)

    def event_answered(self, action: EventAnswered) -> None:
        agent, fields = self.agent, dict(action.fields)
        facet = agent._answered_by.get(action.kind)
        answers = agent.facet(facet) if facet else agent._events
        answers.on_answer(action.kind, fields, action.offset, action.error, action.detail)

    def stopped(self, action: Stopped) -> None:
        self.agent._on_stopped(action)


def _describe(view: View | None) -> str:
    if view is None:
        return "none"
    return f"v{view.version} active_ranks={list(view.active_ranks)}"


def _handle_order(view: View, members: list[int]) -> list[int] | None:
    """The members of a view that torch's reconfigure committed, in the order of its handles
    (the view's backend numbers them so, for the group of torch's model); None otherwise."""
    order = view.cause.get("order") if view.cause.get("kind") == "reconfigure" else None
    if not isinstance(order, list) or sorted(order) != sorted(members):
        return None
    return order
