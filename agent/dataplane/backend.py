"""Building one torch backend per view, and abandoning it safely.

Each view gets its own backend object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on a
GPU), built directly on ``PrefixStore("view/<version>/", store)``: no default group, no
``init_process_group``, no global barrier, so the survivors of a failure can build a group
without the dead rank, and a replacement process can join a later view.

An abandoned backend may still have an operation in flight that never ends (a peer died mid-op);
deleting it blocks until the backend's timeout, so the last reference is dropped in a reaper
thread. NCCL backends are aborted first, which unblocks their kernels. gloo's ``abort()``
returns but leaves the operation waiting; :func:`end_gloo_operations` ends it instead, by
closing the backend's connections (a failed view's, and every view's at close). No wait on a
gloo operation is left to gloo alone either: the failure path ends the caller's wait at once
(see :mod:`agent.dataplane.work`).

An operation must not outlive the process's interpreter: when it ends, gloo's worker thread
runs the operation's callbacks, which take the GIL, and a thread that reaches for the GIL while
the interpreter shuts down is ended inside gloo's error handler (``terminate called after
throwing an instance of 'gloo::IoException'``, exit -6). So ``DataPlane.close()`` ends every
operation of its views before it returns.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed import ProcessGroupGloo, Store

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")

_graveyard: list[object] = []
_graveyard_lock = threading.Lock()


def bury(*objects: object) -> None:
    """Keep ``objects`` alive for the rest of the process: their destructors may block."""
    with _graveyard_lock:
        _graveyard.extend(o for o in objects if o is not None)


class _Reaper:
    """A daemon thread that drops the last reference to each abandoned backend.

    A backend's destructor waits for its operations to end, so it must not run in the thread
    that abandons it. Python runs a destructor wherever the last reference goes, so the reaper
    first waits (briefly) until it holds the only reference left.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._outstanding = 0

    def take(self, backend: object) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dataplane-reaper", daemon=True
                )
                self._thread.start()
            self._outstanding += 1
        self._queue.put(backend)

    def drain(self, timeout: float) -> bool:
        """Wait until every backend taken so far is released; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout)

    def _run(self) -> None:
        while True:
            backend = self._queue.get()
            give_up = time.monotonic() + 10.0
            # getrefcount counts its own argument: 2 means this local is the only holder.
            while sys.getrefcount(backend) > 2 and time.monotonic() < give_up:
                time.sleep(0.005)
            del backend
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()


_reaper = _Reaper()


def drain_released(timeout: float) -> bool:
    """Wait until the backends abandoned so far are released (before the process exits)."""
    return _reaper.drain(timeout)


#: What torch's own NCCL error handling must not do to a foldplane process: tear it down. A
#: failed operation is a failed view here (every member aborts the view's communicator and the
#: next view carries on), so the watchdog only watches; set before the first NCCL backend.
NCCL_ENVIRONMENT = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",  # the watchdog never aborts nor kills the process
    "TORCH_NCCL_ENABLE_MONITORING": "0",  # nor does its heartbeat monitor
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_BLOCKING_WAIT": "0",  # our own wait bounds every operation (see work.py)
}


def prepare_nccl_environment() -> None:
    """Set :data:`NCCL_ENVIRONMENT` where the user has not chosen otherwise (read at build)."""
    import os

    for name, value in NCCL_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def default_cuda_device() -> torch.device:
    """The GPU of this process, as torchrun assigns it: ``cuda:LOCAL_RANK``.

    Without ``LOCAL_RANK`` (a process started by hand), the current CUDA device.
    """
    import os

    local = os.environ.get("LOCAL_RANK")
    count = torch.cuda.device_count()
    if local is not None and local.strip().isdigit():
        index = int(local)
        if index >= count:
            raise ValueError(
                f"LOCAL_RANK={index}, but torch sees {count} CUDA device(s) on this host; "
                "start at most one rank per GPU here, or set CUDA_VISIBLE_DEVICES"
            )
        return torch.device("cuda", index)
    return torch.device("cuda", torch.cuda.current_device())


@dataclass(frozen=True)
class BackendKind:
    """Which backends a data plane builds, on which devices; resolved once per process.

    ``"gloo"``: CPU tensors only. ``"nccl"``: CUDA tensors through NCCL on ``device`` and CPU
    tensors through gloo, in the same view, as torch's ``"cpu:gloo,cuda:nccl"`` default group
    does (``all_gather_object``, small CPU flags and foldplane's own agreements ride gloo).
    ``eager_cuda``: build the NCCL communicator with every view from the first one; otherwise
    it is built the first time a CUDA tensor is used, and with every view after that.
    """

    name: str
    device: torch.device
    gloo_device: object | None = None
    eager_cuda: bool = True

    @classmethod
    def resolve(
        cls,
        name: str,
        device: torch.device | None,
        gloo_hostname: str,
        *,
        eager_cuda: bool = True,
    ) -> BackendKind:
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
        gloo_device = ProcessGroupGloo.create_device(hostname=gloo_hostname)
        if name == "gloo":
            device = torch.device(device) if device is not None else torch.device("cpu")
            if device.type != "cpu":
                raise ValueError(
                    f"the gloo data plane runs on the CPU, got device {device} "
                    "(backend 'nccl' serves CUDA tensors, and CPU tensors through gloo)"
                )
            return cls(name, device, gloo_device, eager_cuda=False)
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs a CUDA device, and torch sees none")
        device = torch.device(device) if device is not None else default_cuda_device()
        if device.type != "cuda":
            raise ValueError(f"the nccl data plane runs on a CUDA device, got device {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        prepare_nccl_environment()
        return cls(name, device, gloo_device, eager_cuda=eager_cuda)

    @property
    def device_types(self) -> tuple[str, ...]:
        """The tensor device types this data plane serves."""
        return ("cpu", "cuda") if self.name == "nccl" else ("cpu",)

    def backend_name(self, device_type: str) -> str:
        return "nccl" if device_type == "cuda" else "gloo"

    @property
    def primary_device_type(self) -> str:
        """The device of this kind's fixed groups (subgroups, HSDP shard groups): ``"cuda"``
        for an explicit ``"nccl"`` data plane, else ``"cpu"`` (the default on a GPU host builds
        NCCL only for CUDA tensors of the views, so CPU-only code stays on gloo)."""
        return "cuda" if self.name == "nccl" and self.eager_cuda else "cpu"

    def create(self, store: Store, index: int, size: int, timeout_s: float) -> object:
        """A backend of this kind's primary device: NCCL (connected) or gloo."""
        return self.create_for(self.primary_device_type, store, index, size, timeout_s)

    def create_for(
        self,
        device_type: str,
        store: Store,
        index: int,
        size: int,
        timeout_s: float,
        *,
        connect: bool = True,
    ) -> object:
        """Rendezvous on ``store`` as in-view rank ``index`` of ``size``; blocks until built.

        ``connect``: a NCCL communicator is also connected before this returns (NCCL sets up its
        links lazily, at the first operation otherwise); see :func:`connect_nccl`.
        """
        timeout = timedelta(seconds=timeout_s)
        if device_type == "cpu":
            opts = ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [self.gloo_device]
            return ProcessGroupGloo(store, index, size, opts)
        if self.name != "nccl":
            raise ValueError(f"the {self.name} data plane serves no {device_type} tensors")
        from torch.distributed import ProcessGroupNCCL  # absent from CPU builds

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        backend = ProcessGroupNCCL(store, index, size, opts)
        backend.eager_connect_single_device(self.device)  # the communicator exists from here
        if connect:
            connect_nccl(backend, self.device)
        return backend

    def abandon(self, backend: object | None) -> None:
        """Stop using ``backend``: abort it where that unblocks its ops (NCCL), then release it.

        The release happens in the reaper thread, because the destructor waits for the backend's
        operations to end (a gloo op stuck on a dead peer ends at its timeout): the caller never
        blocks, and a long job's old views do not keep their threads and sockets. An aborted
        NCCL backend is never destroyed (NCCL's destroy after an abort may wait for peers that
        aborted too): it is kept for the life of the process; the abort already freed its
        communicator.
        """
        if backend is None:
            return
        if is_nccl(backend):
            abort_nccl(backend)
            bury(backend)
            return
        _reaper.take(backend)


#: The tag of the receive that closes a gloo backend's connections (no operation uses it).
_CLOSING_TAG = 0x7F0DC105
#: How long that receive waits: its timeout is what closes the connections.
_CLOSING_WAIT = timedelta(milliseconds=5)


def end_gloo_operations(backend: object, index: int, size: int) -> None:
    """End the operations in flight on a gloo ``backend`` (in-group rank ``index`` of
    ``size``) now: each fails with gloo's "Application timeout caused pair closure".

    gloo has no abort that reaches an operation in flight, but a receive that times out closes
    every connection of its context and fails whatever waits on one. So a receive from each peer
    in turn, with a tiny timeout: the first that reaches a live connection times out and closes
    them all; a connection closed already (by its own error, or that timeout) raises at once.
    The peers see their connections to this rank close: only for a backend that nobody may use
    any more (a failed view's, or any view's at close).
    """
    probe = torch.empty(1)
    for peer in range(size):
        if peer == index:
            continue
        try:
            backend.recv([probe], peer, _CLOSING_TAG).wait(_CLOSING_WAIT)  # type: ignore[attr-defined]
        except RuntimeError:  # the timeout that closed the connections, or a closed one
            continue


def is_nccl(backend: object) -> bool:
    return type(backend).__name__ == "ProcessGroupNCCL"


def abort_nccl(backend: object) -> None:
    """Abort a NCCL backend (idempotent): its kernels in flight return, its streams move on."""
    try:
        backend.abort()  # type: ignore[attr-defined]
    except RuntimeError as e:
        log.warning("aborting a NCCL backend failed: %s", e)


def connect_nccl(backend: object, device: torch.device) -> None:
    """Connect ``backend``'s communicator on ``device`` now: one 1-element all-reduce on a side
    stream, waited for on the CPU. A peer that died meanwhile leaves it hanging until the
    backend is aborted (the view's failure does that)."""
    from torch.distributed import AllreduceOptions

    stream = torch.cuda.Stream(device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        probe = torch.zeros(1, device=device)
        backend.allreduce([probe], AllreduceOptions()).wait()  # type: ignore[attr-defined]
        stream.synchronize()
