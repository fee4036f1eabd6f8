"""A test clock for protocols that keep their own timers on the event loop (``loop.call_at``):
the protocol is given a :class:`Clock` as its loop, time moves only when the test says, and the
timers run in order as the clock passes them, so no test waits on real time."""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

#: The most timers one :meth:`Clock.advance` runs: a protocol that re-arms a timer for a moment
#: already past would otherwise run it forever (a busy loop on a real event loop).
MAX_TIMERS_PER_ADVANCE = 1000


class Clock:
    """The event loop as the protocol sees it, with time that moves only when told; timers
    run in order as the clock passes them. Everything else is the real loop's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, now: float = 1000.0) -> None:
        self._loop = loop
        self.now = now
        self._timers: list[tuple[float, int, asyncio.TimerHandle, Any]] = []
        self._seq = 0
        self.set_timers = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self._loop)
        self._seq += 1
        self.set_timers += 1
        heapq.heappush(self._timers, (when, self._seq, handle, callback))
        return handle

    def call_later(self, delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        return self.call_at(self.now + delay, callback, *args)

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        for _ in range(MAX_TIMERS_PER_ADVANCE):
            if not self._timers or self._timers[0][0] > target:
                break
            when, _, handle, _ = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled():
                handle._run()
        else:
            raise AssertionError(
                f"{MAX_TIMERS_PER_ADVANCE} timers ran within {seconds} s: a timer re-arms "
                "itself for a moment already past"
            )
        self.now = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)
