"""The rendezvous store the coordinator hosts for the data plane (a torch ``TCPStore``).

Each committed view's process group rendezvouses under its own prefix in this store, so the
workers need no store of their own and no ``MASTER_ADDR``; ``GET /agents/updates`` advertises
its address. torch is imported only here and only when ``serve`` starts the store, so the rest of
the coordinator (and ``replay``) never pays for importing it.
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

_ANY = {"", "0.0.0.0", "::"}


def advertised_host(bind_host: str) -> str:
    """The address workers should dial: the bind address, or this machine's name for a
    wildcard bind."""
    return socket.getfqdn() if bind_host in _ANY else bind_host


def start_store(
    bind_host: str, port: int = 0, *, advertise: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """Start a master ``TCPStore`` on ``bind_host:port`` (0: any free port).

    Returns the store (keep a reference: the store stops when it is collected) and the address
    to advertise, ``{"host", "port", "id"}``. ``id`` is new at every start: a coordinator that
    restarts on the same fixed port brings a store that lost its keys, and agents must see
    that it is another store even though the address is the same.
    """
    from torch.distributed import TCPStore

    store = TCPStore(bind_host or "0.0.0.0", port, is_master=True, wait_for_workers=False)
    return store, {
        "host": advertise or advertised_host(bind_host),
        "port": int(store.port),
        "id": uuid.uuid4().hex,
    }
