"""The costs every decision of the fold stands on, measured beside the rows that rest on them."""

from __future__ import annotations

import time


async def fsync_floor(path: str, n: int) -> list[float]:
    """Milliseconds of ``n`` durable appends of one record each (fsync included) to a SQLite
    log at ``path``, after two that warm up: the floor under every decision of the fold."""
    from ...eventlog import NewRecord, open_log

    log = await open_log(f"sqlite:///{path}")
    try:
        times = []
        for i in range(n + 2):
            rec = NewRecord(kind="heartbeat", group="floor", rank=0, payload={"step": i})
            t0 = time.perf_counter()
            await log.append([rec])
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        await log.close()
