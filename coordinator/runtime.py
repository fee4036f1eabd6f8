"""How a coordinator process runs: its event loop, and the garbage collector's and the GIL's
settings for a server whose event loop must not stand still. ``coordinator serve`` applies them;
the benchmarks' load generators run on the same loop and thresholds."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency everywhere but Windows), else
    asyncio's default; the benchmarks' load generators run on it too."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


#: How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.0005
#: The cyclic GC's thresholds (CPython's default: 700, 10, 10); see :func:`tune_for_latency`.
GC_THRESHOLDS = (10_000, 100, 10)


def tune_for_latency() -> None:
    """Three process-wide settings for the server, all about the event loop standing still.

    - ``gc.freeze`` after startup keeps what startup built (modules, the app, the restored
      fold) out of every later collection: with it in, each full collection walks all of it
      while the event loop stands still, and every request queued behind it waits as long.
    - Larger GC thresholds (:data:`GC_THRESHOLDS`). A heartbeat's objects (its request, its
      input, its reply) live until its shared record is durable, up to ``--heartbeat-flush-s``;
      at CPython's defaults the young generations are collected every few milliseconds, so
      nearly every in-flight beat is promoted to the oldest generation, and a full collection
      (which walks every rank's state, every journal and every open connection: at 16,384
      ranks, over a million references) follows each time a quarter of the survivors' count
      has been promoted, several times a second. Collected every 10,000 allocations, and the
      middle generation every 100 of those, beats are freed by their reference counts before
      they reach the old generation, and full collections become rare. A heartbeat's path
      makes no reference cycles, so what the young generations hold longer is not garbage.
    - A shorter GIL switch interval: the log's writer thread needs the GIL for a moment
      after each SQLite call of a commit (begin, insert, commit, hand back the offsets);
      while the event loop is busy serving requests, each of those moments can wait a whole
      switch interval, so at the default a commit is acknowledged several times later than
      its own work takes.

    What either setting is worth on a given machine is measured by the ``ingest`` benchmark
    (figures in docs/benchmarks.md); code comments state the rule, not a run's numbers.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
