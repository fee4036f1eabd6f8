"""The rendezvous facet's read model: what its routes read, as the host publishes it once per
cycle (``coordinator/fold/facets.py``, ``Facet.read_model``).

Each job's status (``job_status``, ``GET /rendezvous/{job}``'s data) and its line in the list
are rendered when a record changed that job (one of its nodes' inputs, a deadline of its own,
a resume); every other job's are the model before's, shared. ``status`` hands out a fresh
top-level dict (a reader may edit it; the lists in it are shared and never edited).
"""

from __future__ import annotations

from typing import Any

from ...coordinator.fold.facets import rerendered
from .state import Job, job_status


class JobReads:
    """One job as of one cycle: its status and its line in ``GET /rendezvous``."""

    __slots__ = ("status", "line")

    def __init__(self, job: Job) -> None:
        self.status = job_status(job)
        self.line = {
            "job": job.job,
            "round": job.round,
            "nodes": [m.node for m in job.members],
            "waiting": len(job.pending),
            "closed": job.closed is not None,
        }


class RendezvousReads:
    """Every job's rendezvous as of one cycle (see the module docstring)."""

    __slots__ = ("_jobs", "_names")

    def __init__(self, jobs: dict[str, JobReads]) -> None:
        self._jobs = jobs
        self._names = sorted(jobs)

    def names(self) -> list[str]:
        return list(self._names)

    def status(self, job: str) -> dict[str, Any] | None:
        """The job as ``job_status`` renders it (None: no node ever joined it)."""
        got = self._jobs.get(job)
        return None if got is None else dict(got.status)

    def lines(self) -> list[dict[str, Any]]:
        """Every job's line of ``GET /rendezvous``, by name."""
        return [self._jobs[name].line for name in self._names]


def read_model(
    jobs: dict[str, Job], previous: RendezvousReads | None, moved: set[str]
) -> RendezvousReads:
    """From scratch when ``previous`` is None, else ``previous`` with the jobs of ``moved``
    rendered again."""
    if previous is None:
        return RendezvousReads({name: JobReads(job) for name, job in jobs.items()})
    if not moved:
        return previous
    out = rerendered(previous._jobs, jobs, moved, JobReads)  # noqa: SLF001 - same module
    return RendezvousReads(out)
