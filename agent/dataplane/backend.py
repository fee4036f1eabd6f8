"""Building one torch backend per view, and abandoning it safely.

Each view gets its own backend object (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on a
GPU), built directly on ``PrefixStore("view/<version>/", store)``: no default group, no
``init_process_group``, no global barrier, so the survivors of a failure can build a group
without the dead rank, and a replacement process can join a later view.

An abandoned backend may still have an operation in flight that never ends (a peer died mid-op);
deleting it would block until the backend's timeout, so it goes to a graveyard that lives as long
as the process. NCCL backends are aborted first, which unblocks their kernels; gloo cannot be
unblocked (``abort()`` returns but the op waits out its timeout), which is why gloo operations are
always issued asynchronously and waited on with an event the failure path can set.
"""

from __future__ import annotations

import logging
import threading
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


def graveyard_size() -> int:
    with _graveyard_lock:
        return len(_graveyard)


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
        """Stop using ``backend``: abort it where that unblocks its ops (NCCL), then bury it."""
        if backend is None:
            return
        if self.name == "nccl":
            try:
                backend.abort()  # type: ignore[attr-defined]
            except RuntimeError as e:
                log.warning("aborting an abandoned NCCL backend failed: %s", e)
        bury(backend)
