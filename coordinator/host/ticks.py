"""Time for the fold: a ``tick`` appended once its next deadline has passed (it has no clock)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: How long to wait for a change when a tick did not move the deadline, in seconds.
STUCK_WAIT_S = 0.1
#: Added to a deadline's wait so the tick's timestamp is past the deadline, in seconds.
DEADLINE_MARGIN_S = 0.0005


@dataclass(frozen=True, slots=True)
class TickNow:
    """Append a tick: ``deadline`` has passed."""

    deadline: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait for the fold to change, at most ``timeout`` seconds (None: no deadline)."""

    timeout: float | None
    #: the deadline a tick was appended for, forgotten (see :func:`next_step`)
    forget: bool = False


def next_step(deadline: int | None, now: int, last_ticked: int | None) -> TickNow | Wait:
    """What the ticker does with the fold's next ``deadline`` (ns) at wall clock ``now`` (ns),
    having last appended a tick for ``last_ticked``.

    A deadline that has passed gets one tick. If the tick did not move it (nothing was due
    after all, or the fold keeps it), the ticker does not spin on it: it waits for the next
    change, at most :data:`STUCK_WAIT_S`, then may tick for it once more.
    """
    if deadline is not None and now > deadline:
        if deadline == last_ticked:
            return Wait(STUCK_WAIT_S, forget=True)
        return TickNow(deadline)
    if deadline is None:
        return Wait(None)
    return Wait((deadline - now) / 1e9 + DEADLINE_MARGIN_S)


class Ticker:
    """Appends ``tick`` records through ``submit`` as :func:`next_step` says, waking whenever
    ``changed`` is set (the host sets it after every batch) or a wait runs out."""

    def __init__(
        self,
        next_deadline: Callable[[], int | None],
        submit: Callable[[], Awaitable[object]],
        changed: asyncio.Event,
        *,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.next_deadline = next_deadline
        self.submit = submit
        self.changed = changed
        self.clock = clock

    async def run(self, stop: type[BaseException]) -> None:
        """Tick until ``submit`` raises ``stop`` (the host no longer takes inputs)."""
        last_ticked: int | None = None
        while True:
            self.changed.clear()
            step = next_step(self.next_deadline(), self.clock(), last_ticked)
            if isinstance(step, TickNow):
                last_ticked = step.deadline
                try:
                    await self.submit()
                except stop:
                    return
                continue
            if step.forget:
                last_ticked = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(step.timeout):
                    await self.changed.wait()
