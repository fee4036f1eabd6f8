"""Building one torch backend per view, and abandoning it safely.

Each view gets its own backend object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on a
GPU), built directly on ``PrefixStore("view/<version>/", store)``: no default group, no
``init_process_group``, no global barrier, so the survivors of a failure can build a group
without the dead rank, and a replacement process can join a later view.

An abandoned backend may still have an operation in flight that never ends (a peer died mid-op);
deleting it blocks until the backend's timeout, so the last reference is dropped in a reaper
thread. NCCL backends are aborted first, which unblocks their kernels; gloo cannot be unblocked
(``abort()`` returns but the op waits out its timeout), which is why no wait on a gloo operation
is ever left to gloo alone: the failure path can always end it (see :mod:`agent.dataplane.work`).
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


@dataclass(frozen=True)
class BackendKind:
    """Which backend a data plane builds, on which device; resolved once per process."""

    name: str
    device: torch.device
    gloo_device: object | None = None

    @classmethod
    def resolve(cls, name: str, device: torch.device | None, gloo_hostname: str) -> BackendKind:
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
        if name == "gloo":
            device = device or torch.device("cpu")
            if device.type != "cpu":
                raise ValueError(f"the gloo data plane runs on the CPU, got device {device}")
            return cls(name, device, ProcessGroupGloo.create_device(hostname=gloo_hostname))
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs a CUDA device, and torch sees none")
        device = device or torch.device("cuda", torch.cuda.current_device())
        if device.type != "cuda":
            raise ValueError(f"the nccl data plane runs on a CUDA device, got device {device}")
        torch.cuda.set_device(device)
        return cls(name, device)

    def create(self, store: Store, index: int, size: int, timeout_s: float) -> object:
        """Rendezvous on ``store`` as in-view rank ``index`` of ``size``; blocks until connected."""
        timeout = timedelta(seconds=timeout_s)
        if self.name == "gloo":
            opts = ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [self.gloo_device]
            return ProcessGroupGloo(store, index, size, opts)
        from torch.distributed import ProcessGroupNCCL  # absent from CPU builds

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        backend = ProcessGroupNCCL(store, index, size, opts)
        # Connect now, so "built" means the communicator exists (NCCL is lazy otherwise).
        backend.eager_connect_single_device(self.device)
        return backend

    def abandon(self, backend: object | None) -> None:
        """Stop using ``backend``: abort it where that unblocks its ops (NCCL), then release it.

        The release happens in the reaper thread, because the destructor waits for the backend's
        operations to end (a gloo op stuck on a dead peer ends at its timeout): the caller never
        blocks, and a long job's old views do not keep their threads and sockets.
        """
        if backend is None:
            return
        if self.name == "nccl":
            try:
                backend.abort()  # type: ignore[attr-defined]
            except RuntimeError as e:
                log.warning("aborting an abandoned NCCL backend failed: %s", e)
        _reaper.take(backend)
