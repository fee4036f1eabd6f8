"""The store a refit world meets on, hosted by publisher slot 0, and the bootstrap that names it.

Publisher slot 0 hosts a :class:`RefitStore` for as long as it refits; every attempt gets a
fresh bootstrap from :meth:`RefitStore.bootstrap` (same store, new prefix), which the control
plane carries to the admitted members. A new prefix means a new world: nothing of a failed
attempt's keys (its joins, its lanes' rendezvous, its failure notice) is ever read again.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import torch
from torch.distributed import TCPStore

from ...wire.refit import Bootstrap


class RefitStore:
    """A TCPStore hosted in this process, for refit worlds; close it when refits are over."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0) -> None:
        self.host = host
        self._store = TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        self.port = self._store.port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def bootstrap(self, backend: str | None = None) -> dict[str, str]:
        """A new world's bootstrap: this store, a prefix never used before, the backend
        (``"nccl"`` when CUDA is available, else ``"gloo"``, unless given)."""
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        return Bootstrap(store=self.address, prefix=uuid.uuid4().hex, backend=backend).as_dict()

    def close(self) -> None:
        """Stop hosting: members still using a world on it fail (the store is gone)."""
        self._store = None  # type: ignore[assignment]


def make_bootstrap(
    backend: str | None = None, host: str = "127.0.0.1", port: int = 0
) -> tuple[RefitStore, dict[str, str]]:
    """Host a :class:`RefitStore` and return it with its first bootstrap (publisher slot 0)."""
    store = RefitStore(host, port)
    return store, store.bootstrap(backend)
