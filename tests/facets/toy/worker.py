"""The toy facet's worker part: a worker's side of its group's counter, in the facet's folder.
The agent loads it by the name ``protocol.py`` declares (``WORKER``) when ``FOLDPLANE_FACETS``
names the facet in the worker's environment, as it loads the facets of foldplane's, and
answers what it offers as its own: ``agent.counter`` (the count as last heard, and a wait for
one) and ``agent.add_to_counter(by)``. Nothing of foldplane names it."""

from __future__ import annotations

import threading
import time
from typing import Any

from foldplane.agent.events import ANSWER_S, EventAnswers
from foldplane.agent.facets import WorkerSide
from tests.facets.toy.protocol import CounterUpdate


class Counter:
    """The group's counter as this rank last heard it (``count``: None before the first
    update); fed by the agent's driver thread, waited on by the worker's."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count: int | None = None
        self.stopped: str | None = None

    def on_update(self, update: CounterUpdate) -> None:
        with self._cond:
            self.count = update.count
            self._cond.notify_all()

    def on_stopped(self, why: str) -> None:
        with self._cond:
            self.stopped = why
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until the counter is at least ``count``; False if it was not within ``timeout``
        seconds or the agent stopped first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.stopped is None and (self.count is None or self.count < count):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.count is not None and self.count >= count


class ToyWorker:
    """The facet's worker part, one per agent."""

    def __init__(self, side: WorkerSide) -> None:
        self.side = side
        #: the group's counter (``agent.counter``)
        self.counter = Counter()
        self._answers = EventAnswers(side.send)

    def add_to_counter(self, by: int, timeout: float = ANSWER_S) -> int | None:
        """Add ``by`` to the group's counter (a ``toy_add`` event); the offset of its record,
        or ``agent.EventRefused`` with the fold's code and reason."""
        return self._answers.send("toy_add", {"by": by}, timeout)

    def on_update(self, update: CounterUpdate) -> None:
        self.counter.on_update(update)

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None:
        self._answers.on_answer(kind, fields, offset, error, detail)

    def on_stopped(self, why: str) -> None:
        self.counter.on_stopped(why)
        self._answers.on_stopped(why)


WORKER = ToyWorker
