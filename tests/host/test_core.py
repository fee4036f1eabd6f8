"""The host core (``coordinator/host/core.py``): one core that the service's loop and the
simulator both drive.

- Driven by hand, with no event loop, log or clock: a cycle admits, steps, carries out and
  answers, and the API's read model moves only when the driver says the cycle is carried out.
- The service's :class:`Host` and the simulator's coordinator are drivers of a
  :class:`HostCore`: neither keeps the fold, the journals or the queue of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.host.core import HostCore
from foldplane.coordinator.host.inputs import Appended, queue_submission
from foldplane.coordinator.host.loop import Host
from foldplane.coordinator.host.ready import HostState
from foldplane.eventlog.record import NewRecord, Record
from foldplane.sim.world import World

S = 1_000_000_000
T0 = 1_764_000_000 * S


class _Answers:
    """A submission's answers, one per input (what a request would be sent)."""

    def __init__(self, n: int) -> None:
        self.results: list[Any] = [None] * n

    def set(self, index: int, outcome: Any) -> None:
        self.results[index] = outcome

    def set_many(self, indices: list[int], outcome: Any) -> None:
        for index in indices:
            self.set(index, outcome)

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(f"failed: {exc}")

    def done(self) -> bool:
        return None not in self.results


def _cycle(core: HostCore, log: list[Record], now: float) -> None:
    """One cycle as a driver runs it, the log a list."""
    accepted = core.admit(core.take(64), now)
    records = [
        Record(len(log) + 1 + i, T0 + len(log) + i, 1, *_fields(item.record), 0)
        for i, item in enumerate(accepted)
    ]
    log.extend(records)
    ready = core.step(records, projected=0)
    core.publish_updates(ready)
    assert core.reads.offset < ready.offset  # not yet carried out: the API reads the last cycle
    core.carried_out(ready)
    core.answer(accepted, [r.offset for r in records], ready, now)


def _fields(rec: NewRecord) -> tuple[Any, ...]:
    return rec.kind, rec.group, rec.rank, rec.payload


def test_a_cycle_driven_by_hand_admits_steps_publishes_and_answers() -> None:
    core = HostCore(Coordinator(), HostState(), heartbeat_flush_s=0)
    log: list[Record] = []
    created = _Answers(1)
    queue_submission(
        core.queue,
        [NewRecord(kind="group_created", group="g", payload={"world_size": 2, "config": {}})],
        created,  # type: ignore[arg-type]
        None,
        None,
        0.0,
        normalized=False,
    )
    _cycle(core, log, 0.0)
    assert created.results == [Appended(1)]
    assert core.reads.offset == 1 and core.reads.group_status("g") is not None
    joins = _Answers(2)
    queue_submission(
        core.queue,
        [
            NewRecord(kind="join", group="g", rank=r, payload={"incarnation": f"i{r}"})
            for r in (0, 1)
        ],
        joins,  # type: ignore[arg-type]
        None,
        None,
        1.0,
        normalized=False,
    )
    _cycle(core, log, 1.0)
    assert joins.results == [Appended(2), Appended(3)]
    assert core.applied == 3
    status = core.reads.group_status("g")
    assert status is not None and [r["state"] for r in status["ranks"]] == ["SYNCED", "SYNCED"]
    # rank 0's long poll: what the journal holds for it since the start
    answer = core.updates_now("g", (0,), 0)
    assert answer is not None and answer.next_after >= 1


async def test_the_service_and_the_simulator_drive_one_core(tmp_path: Path) -> None:
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        assert isinstance(host.core, HostCore)
        assert host.machine is host.core.machine and host.journals is host.core.journals
        assert host.queue is host.core.queue and host.published is host.core.published
    finally:
        await host.close()
    coordinator = next(c for seed in range(20) if (c := World(seed, 200).run().coord) is not None)
    assert isinstance(coordinator.core, HostCore)
    assert coordinator.machine is coordinator.core.machine
    assert coordinator.core.applied == coordinator.machine.offset
