"""A foldplane coordinator in the place of torchft's lighthouse: a real ``python -m coordinator
serve --lighthouse-port`` process on a SQLite file, with the constructor, ``address()`` and
``shutdown()`` of torchft's ``LighthouseServer`` (``torchft._torchft``), so torchft's own tests
run against it unchanged."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.conftest import free_port
from tests.service.conftest import Server


class FoldplaneLighthouse:
    """``LighthouseServer(bind, min_replicas, join_timeout_ms, quorum_tick_ms,
    heartbeat_timeout_ms)`` as torchft's tests call it; ``bind`` is torchft's (``[::]:0``): the
    coordinator binds its lighthouse on loopback at a free port, as foldplane does unless told."""

    def __init__(
        self,
        bind: str = "[::]:0",
        min_replicas: int = 1,
        join_timeout_ms: int | None = None,
        quorum_tick_ms: int | None = None,
        heartbeat_timeout_ms: int | None = None,
        *,
        directory: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._tmp = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="foldplane-lighthouse-")
            directory = Path(self._tmp.name)
        self.directory = directory
        self.port = free_port()
        options = ["--store-port", "-1", "--lighthouse-port", str(self.port),
                   "--lighthouse-min-replicas", str(min_replicas)]  # fmt: skip
        for flag, value in (
            ("--lighthouse-join-timeout-ms", join_timeout_ms),
            ("--lighthouse-quorum-tick-ms", quorum_tick_ms),
            ("--lighthouse-heartbeat-timeout-ms", heartbeat_timeout_ms),
        ):
            if value is not None:
                options += [flag, str(value)]
        self.server = Server(
            db=directory / "log.db",
            port=free_port(),
            log_path=directory / "server.log",
            args=options,
            env={**(env or {}), "PYTHONUNBUFFERED": "1"},
        ).start()

    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        return self.server.db

    def shutdown(self) -> None:
        self.server.stop()

    def cleanup(self) -> None:
        self.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __repr__(self) -> str:
        return f"FoldplaneLighthouse({self.address()}, log {self.db}, pid {os.getpid()})"
