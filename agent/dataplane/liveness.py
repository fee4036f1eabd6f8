"""Which ranks are alive: store heartbeat counters, compared a few periods apart.

A backend error does not say which rank failed (a reset connection names only an ``ip:port``; a
timeout names nobody), so every process runs a heartbeat thread that increments
``hb/<rank>/<incarnation>`` every ``period``. After a failure, a rank reads its peers' counters,
waits ``window_periods`` periods and reads them again: a counter that did not move belongs to a
process that is dead or stopped (SIGKILL and SIGSTOP both stop its thread). The store is touched
only on failure, never per operation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from torch.distributed import Store

from . import keys

log = logging.getLogger(__name__)


class Heartbeat:
    """A daemon thread that increments this process's liveness counter every ``period`` seconds.

    ``healthy`` is False while the store cannot be reached (the thread keeps trying).
    """

    def __init__(self, store: Store, rank: int, incarnation: str, period: float) -> None:
        self._store = store
        self._key = keys.heartbeat(rank, incarnation)
        self._period = period
        self._stop = threading.Event()
        self.healthy = False
        store.add(self._key, 1)  # the counter exists before anyone is told this incarnation
        self.healthy = True
        self._thread = threading.Thread(
            target=self._run, name=f"dataplane-heartbeat-{rank}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._store.add(self._key, 1)
                self.healthy = True
            except RuntimeError as e:  # DistNetworkError and friends: the store is gone for now
                if self.healthy:
                    log.warning("liveness heartbeat %s cannot reach the store: %s", self._key, e)
                self.healthy = False

    def stop(self, *, wait: bool = True) -> None:
        """Stop counting; ``wait=False`` does not wait for an increment in flight (the store may
        be gone, and the thread leaves after it)."""
        self._stop.set()
        if wait:
            self._thread.join(timeout=5 * self._period + 1.0)


def _incarnation_of(store: Store, version: int, rank: int) -> str | None:
    """The incarnation that took part in ``version`` as ``rank``, else the rank's latest, else None."""
    for key in (keys.member(version, rank), keys.incarnation(rank)):
        if store.check([key]):
            return store.get(key).decode()
    return None


def find_dead(
    store: Store,
    version: int,
    ranks: Sequence[int],
    *,
    period: float,
    window_periods: int,
    sleep: Callable[[float], None] = time.sleep,
    unregistered_are_dead: bool = True,
) -> list[int]:
    """The ranks among ``ranks`` whose process did not heartbeat over ``window_periods`` periods.

    A rank that never registered an incarnation never started a data plane: after a failure it
    counts as dead; while a view is still being built (``unregistered_are_dead=False``) it may
    simply not have started yet.
    """
    incarnations = {r: _incarnation_of(store, version, r) for r in ranks}
    dead = [r for r, inc in incarnations.items() if inc is None and unregistered_are_dead]
    watched = [(r, keys.heartbeat(r, inc)) for r, inc in incarnations.items() if inc is not None]
    if watched:
        before = _counters(store, [k for _, k in watched])
        sleep(window_periods * period)
        after = _counters(store, [k for _, k in watched])
        dead += [r for (r, _), b, a in zip(watched, before, after, strict=True) if a == b]
    return sorted(dead)


def _counters(store: Store, counter_keys: list[str]) -> list[int]:
    return [int(v) for v in store.multi_get(counter_keys)]
