"""The epochs facet's worker part (docs/data.md): what a worker follows of its group's epochs
and reports back, in the facet's folder. The agent loads it by the name the facet's
``protocol.py`` declares (``WORKER``) and offers :attr:`EpochsWorker.data` and
:meth:`EpochsWorker.plan_epoch` as its own (``agent.data``, ``agent.plan_epoch``):

- ``tracker.py``: what the coordinator said (the plans, this rank's part of each epoch, the
  epochs' ends) and the progress reports, one in flight, the newest replacing one not sent;
- ``sampler.py``: the torch ``Sampler`` that reads this rank's part (``ElasticSampler``).

>>> from foldplane.facets.epochs.worker import ElasticSampler

A module of the worker side: it imports the agent's and the facet's pure modules (its
protocol, the data cursor), never the facet's server parts, and no server module imports it
(the import contracts say so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol import DataAssignmentUpdate, DataMovesUpdate, EpochCompleteUpdate, EpochPlanUpdate
from .sampler import ElasticSampler
from .tracker import EpochError, EpochTracker, Part

if TYPE_CHECKING:
    from ....agent.facets import WorkerSide


class EpochsWorker:
    """The facet's worker part, one per agent: this rank's epochs (:attr:`data`, fed the
    facet's updates and its progress reports' answers by the agent's driver thread), and what
    the Agent offers of it as its own: ``agent.data`` and ``agent.plan_epoch(...)``."""

    def __init__(self, side: WorkerSide) -> None:
        self.side = side
        #: this rank's epochs (``Agent.data``), which ``ElasticSampler`` reads
        self.data = EpochTracker(side.rank, self.report)

    def plan_epoch(self, epoch: int, dataset_size: int, **plan: Any) -> dict[str, Any]:
        """``POST /groups/{group}/epochs``: declare an epoch (the same plan again is the same
        epoch); returns the epoch as the coordinator answered. Raises :class:`EpochError` with
        the coordinator's reason when it refuses."""
        from ....agent.client import CoordinatorError

        body = {"epoch": epoch, "dataset_size": dataset_size, **plan}
        try:
            return self.side.request(  # type: ignore[no-any-return]
                "POST", f"/groups/{self.side.group}/epochs", json=body
            )
        except CoordinatorError as exc:
            raise EpochError(f"rank {self.side.rank}: epoch {epoch} refused: {exc}") from exc

    def report(self, epoch: int, assignment: int, processed: int, rate: float | None) -> None:
        """Send one progress report (the tracker's, when it reports): a report
        (``ProgressEvent.report``), so the agent sends the newest one only."""
        fields: dict[str, Any] = {"epoch": epoch, "assignment": assignment, "processed": processed}
        if rate is not None:
            fields["rate"] = rate
        self.side.send("progress", fields)

    # -- the agent's hooks ------------------------------------------------------------------

    def on_update(
        self, update: EpochPlanUpdate | DataAssignmentUpdate | DataMovesUpdate | EpochCompleteUpdate
    ) -> None:
        self.data.on_update(update)

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None:
        self.data.on_answer(
            fields["epoch"], fields["assignment"], fields["processed"], error, detail
        )

    def on_stopped(self, why: str) -> None:
        self.data.on_stopped(why)


#: What the agent makes of this package (``wire.facets.WorkerPart``, ``agent/facets.py``).
WORKER = EpochsWorker

__all__ = ["WORKER", "ElasticSampler", "EpochError", "EpochTracker", "EpochsWorker", "Part"]
