"""What the rendezvous facet's effects ask of the host: each is a notice that wakes the long
polls of its job (``GET /rendezvous/{job}?after=VERSION``, ``routes.py``) once its batch is
carried out (its rows written), and the decisions an operator reads (a round formed, a node
lost or timed out, a job closed) are one log line each. A node's join and its keep-alives stay
quiet."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from ...coordinator.fold.effects import Effect
from ...coordinator.host.facets import FacetHost
from ...coordinator.host.loop import Host
from ...coordinator.host.ready import HostState, Ready
from .effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
    RoundFormed,
)

#: The effects that move a job (every one of them sets its ``version``).
JOB_EFFECTS = (JobCreated, NodeJoined, RoundFormed, NodeLeft, JobClosed)


def _notice(state: HostState, effect: Any, ready: Ready) -> None:
    """The job moved: its long polls hear of it once the batch is carried out."""
    ready.notices.append(effect)


class JobWaiters:
    """The long polls of one coordinator waiting for jobs to move: a future per poll, each
    resolved by the first notice about its job (``Host.listeners``)."""

    def __init__(self, host: Host) -> None:
        self._futures: dict[str, set[asyncio.Future[None]]] = {}
        host.listeners.append(self._heard)

    def waiter(self, job: str) -> asyncio.Future[None]:
        """A future the job's next move resolves; :meth:`forget` it when done. Take it with
        nothing awaited since the job's version was read, so no move falls between the two."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures.setdefault(job, set()).add(future)
        return future

    def waiting(self, job: str) -> int:
        """How many long polls of ``job`` wait for its next move."""
        return len(self._futures.get(job, ()))

    def forget(self, job: str, future: asyncio.Future[None]) -> None:
        waiting = self._futures.get(job)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._futures[job]

    def _heard(self, effect: Effect) -> None:
        if isinstance(effect, JOB_EFFECTS):
            for future in self._futures.pop(effect.job, ()):
                if not future.done():
                    future.set_result(None)


_waiters: weakref.WeakKeyDictionary[Host, JobWaiters] = weakref.WeakKeyDictionary()


def waiters_of(host: Host) -> JobWaiters:
    """The long polls of ``host`` (made on first use, listening from then on)."""
    found = _waiters.get(host)
    if found is None:
        found = _waiters[host] = JobWaiters(host)
    return found


def _round(effect: RoundFormed) -> str:
    return f"rendezvous {effect.job} {effect.reason}"


def _left(effect: NodeLeft) -> str | None:
    return None if effect.how == "left" else f"rendezvous {effect.job}: {effect.reason}"


def _closed(effect: JobClosed) -> str:
    return (
        f"rendezvous {effect.job} closed after round {effect.round} by node {effect.node}: "
        f"{effect.reason}"
    )


HOST = FacetHost(
    carry=dict.fromkeys(JOB_EFFECTS, _notice),
    decisions={RoundFormed: _round, NodeLeft: _left, JobClosed: _closed},
    # how ``explain --rdzv`` labels a story's entries (story.py)
    labels={
        "round": lambda e: f"round {e.get('round', '?')}",
        "joined": lambda e: f"joined ({e.get('cause', '?')})",
    },
)
