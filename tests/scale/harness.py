"""An in-process coordinator for the scale suites: the real ``Host`` on a real SQLite file,
served by the real HTTP app (uvicorn on 127.0.0.1, a free port) in the test's event loop, so a
group of thousands of simulated agents (``agent.simhost``) runs in one process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from foldplane.api.app import create_app
from foldplane.api.server import Server, config
from foldplane.coordinator.host.loop import Host
from foldplane.eventlog import NewRecord
from tests.conftest import free_port


@contextlib.asynccontextmanager
async def serving(
    db: Path, start_timeout: float = 30.0, **host_options: Any
) -> AsyncIterator[tuple[Host, tuple[str, int]]]:
    """The host served on a free port, yielded once its sockets are bound (``Server.on_started``);
    a server that does not start within ``start_timeout`` seconds fails the test saying so."""
    host = await Host.open(str(db), **host_options)
    port = free_port()
    server = Server(config(create_app(host), "127.0.0.1", port, "warning"))
    server.before_shutdown = host.stop_waiting
    bound = asyncio.Event()
    server.on_started = bound.set
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        started = asyncio.create_task(bound.wait())
        await asyncio.wait(
            {task, started}, timeout=start_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not bound.is_set():
            started.cancel()
            if task.done():
                task.result()  # why it stopped
            raise AssertionError(
                f"the scale harness's server on 127.0.0.1:{port} did not start in {start_timeout} s"
            )
        yield host, ("127.0.0.1", port)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await host.close()


async def create_group(host: Host, group: str, world_size: int, **config: Any) -> None:
    await host.submit(
        NewRecord(
            kind="group_created",
            group=group,
            payload={"world_size": world_size, "config": config},
        )
    )
