"""The HTTP server: uvicorn, adjusted so that stopping it lets the host close cleanly."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Server(uvicorn.Server):
    """uvicorn's server, with two differences that matter for a coordinator:

    - SIGINT/SIGTERM only stop it. uvicorn re-raises the signal once HTTP has drained, which
      would kill the process before the host has closed the log and written its final snapshot.
    - ``before_shutdown`` runs when shutdown starts, before connections drain: the host answers
      its long polls at once instead of letting them run out their timeouts.
    """

    before_shutdown: Callable[[], None] | None = None

    async def shutdown(self, sockets: Any = None) -> None:
        if self.before_shutdown is not None:
            self.before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    """The server settings: no access log, no per-request work the coordinator has no use for
    (proxy headers, Server/Date headers), three seconds to drain on shutdown."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
