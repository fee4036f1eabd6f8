"""Simulated agent hosts for the service benchmarks, on a :class:`~benchmarks.kit.service.Service`.

The agents are ``agent.simhost``'s: the real ``AgentMachine`` for every rank, 8 ranks to a
host by default, each host on its channel: events batched per lane, updates pushed.
:class:`TimedHost` adds a record of what each rank waits for each kind of event.
:func:`split_cores` and :func:`pin` give the coordinator and the simulator cores of their own,
where the machine has two or more; :func:`run_with_server_gc` runs the simulator on the
server's event loop and GC thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ...agent.machine import EventsAnswered, EventsFailed, SendEvents
from ...agent.simhost import SimulatedCluster, SimulatedHost
from ...coordinator.runtime import GC_THRESHOLDS, loop_factory
from .service import Service

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def run_with_server_gc(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on the server's event loop with the server's GC thresholds
    (``coordinator.runtime.GC_THRESHOLDS``), restored afterwards. A simulator holds many agent
    machines in this one process: at CPython's defaults their in-flight events reach the old
    generation, and each full collection walks all of them (tens of milliseconds at 512 ranks,
    a barrier's ACKs waiting behind it, the shared cores taken from the coordinator)."""
    previous = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main())
    finally:
        gc.set_threshold(*previous)


def split_cores() -> tuple[set[int], set[int]] | None:
    """The cores this process may use, split in two halves: the simulator's (this process) and
    the coordinator's; None when there are fewer than two (or the platform cannot pin)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def pin(pid: int, cores: set[int]) -> None:
    """Pin every thread of process ``pid`` (0: this one) to ``cores``; the threads it starts
    later inherit it from theirs (``sched_setaffinity`` on a pid sets that one thread only)."""
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    for tid in [int(t.name) for t in tasks.iterdir()] if tasks.exists() else [pid]:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)


class TimedHost(SimulatedHost):
    """A simulated host that also times what each of its ranks waits for its events.

    A rank's wait for an event runs from the moment its machine hands the event's batch to the
    lane (``SendEvents``) to the answer that says it is durable: queueing behind the host's
    request in flight on that lane, the request, the coordinator's work and, for a heartbeat,
    the wait for its shared record. Each acknowledged event counts under its kind while
    ``recording`` is set; ``acked_at`` keeps when (``time.monotonic()``) every answer that
    acknowledged at least one event arrived, recording or not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recording = False
        #: kind -> every wait recorded (ms)
        self.waits: dict[str, list[float]] = defaultdict(list)
        self.acked_at: list[float] = []
        self._handed: dict[tuple[int, str], tuple[float, tuple[str, ...]]] = {}

    def _send_events(self, rank: int, action: SendEvents) -> None:
        kinds = tuple(e.__struct_config__.tag for e in action.events)
        self._handed[(rank, action.lane)] = (time.perf_counter(), kinds)
        super()._send_events(rank, action)

    def _step(self, rank: int, event: Any) -> None:
        if isinstance(event, EventsAnswered | EventsFailed):
            if isinstance(event, EventsAnswered) and any(
                "offset" in r and "error" not in r for r in event.results
            ):
                self.acked_at.append(time.monotonic())
            handed = self._handed.pop((rank, event.lane), None)
            if handed is not None and self.recording and isinstance(event, EventsAnswered):
                ms = (time.perf_counter() - handed[0]) * 1000
                for kind, result in zip(handed[1], event.results, strict=False):
                    if "offset" in result and "error" not in result:
                        self.waits[kind].append(ms)
        super()._step(rank, event)


class TimedCluster(SimulatedCluster):
    """A :class:`SimulatedCluster` of :class:`TimedHost` s."""

    def __init__(
        self,
        address: tuple[str, int] | Sequence[tuple[str, int]],
        group: str,
        world_size: int,
        *,
        ranks_per_host: int = 8,
        heartbeat_interval_s: float = 1.0,
    ) -> None:
        super().__init__(
            address,
            group,
            world_size,
            ranks_per_host=ranks_per_host,
            heartbeat_interval_s=heartbeat_interval_s,
        )
        self.hosts = [
            TimedHost(
                address,
                group,
                list(host.machines),
                world_size,
                heartbeat_interval_s=heartbeat_interval_s,
                on_change=self._note_change,
            )
            for host in self.hosts
        ]
        self.host_of = {r: h for h in self.hosts for r in h.machines}

    def record(self, on: bool) -> None:
        for host in self.hosts:
            host.recording = on

    def take_waits(self) -> dict[str, list[float]]:
        """Every wait recorded since the last call, by kind (ms)."""
        out: dict[str, list[float]] = defaultdict(list)
        for host in self.hosts:
            for kind, waits in host.waits.items():
                out[kind].extend(waits)
            host.waits = defaultdict(list)
        return dict(out)


async def create_group(service: Service, group: str, world_size: int, **config: Any) -> None:
    """``POST /groups`` over the service's async connection (the simulator's loop runs)."""
    conn = await service.connect()
    try:
        status, body = await conn.request(
            "POST", "/groups", {"group": group, "world_size": world_size, **config}
        )
        if status not in (200, 201):
            raise RuntimeError(f"POST /groups answered {status}: {body}")
    finally:
        await conn.close()


async def form_group(
    service: Service,
    group: str,
    world_size: int,
    *,
    per_host: int = 8,
    heartbeat_interval_s: float = 1.0,
    **config: Any,
) -> TimedCluster:
    """Create ``group``, start its simulated hosts and wait until every rank holds view 1."""
    await create_group(service, group, world_size, **config)
    cluster = TimedCluster(
        ("127.0.0.1", service.port),
        group,
        world_size,
        ranks_per_host=per_host,
        heartbeat_interval_s=heartbeat_interval_s,
    )
    await cluster.start()
    await cluster.wait_until(lambda: cluster.all_on(1), 120)
    return cluster
