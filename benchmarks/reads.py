"""The read model's cost per host cycle: what publishing ``host.reads`` adds to a cycle.

The host publishes the API's read model once per cycle, after the cycle's records are folded
and carried out (``coordinator/host/reads.py``), capturing only what the fold says its steps
changed (``capture.FoldChanges``): a group a record of the cycle named, or whose deadline
a tick found due, is captured again (``coordinator/fold/capture.py``: a tuple per rank field), a
cycle of its heartbeats alone copies only its last beats, and every other group is shared with
the previous cycle's model; a written proposal copies its page of ids. Status and console views
are rendered from a capture when first asked, not at publish.

One group of 16,384 ranks (formed: joins, ready reports, ACKs) beside a group of 8, in one fold
(``Coordinator``, stepped with hand-made records as the host would fold them). Each round times,
on one core (CPU time):

- a cycle of heartbeats: one shared heartbeat record of every rank (what the host appends per
  flush), folded, then published; the baseline is the fold's step of that record, measured in
  the same round, so the ratio says what publishing adds to the cycle;
- a cycle that names the large group: one rank's links report, folded, then published; the
  baseline is rendering the group's status (``GET /groups/{group}``) from its state, what every
  read of a changed group cost before there was a read model (and what the first read of a new
  capture still costs, once, for every reader of the cycle);
- a cycle that names only the small group: one of its links reports, folded, then published
  (the large group is shared, so this must not grow with it);
- a cycle of a tick with no deadline due (a record that names no group, as a lighthouse or a
  rendezvous record does): folded, then published; the baseline is what such a cycle published
  before the fold noted what its steps changed, measured in the same round: every group
  captured again and the proposals copied.
"""

from __future__ import annotations

import time
from typing import Any

from ..coordinator.fold.capture import GroupCapture, proposals_of
from ..coordinator.fold.machine import Coordinator
from ..coordinator.fold.status import group_status
from ..coordinator.host.reads import ReadsPublisher
from ..eventlog.record import Record
from ..wire import ranks as rank_sets
from .harness import Result, lower_is_better_ratio, median

S = 1_000_000_000
T0 = 1_764_000_000 * S
LARGE = 16_384
SMALL = 8


class _Fold:
    """A fold and its read model, stepped with hand-made records."""

    def __init__(self) -> None:
        self.machine = Coordinator()
        self.reads = ReadsPublisher(self.machine)
        self.offset = 0

    def step(self, t: int, kind: str, group: Any, rank: Any, payload: dict[str, Any]) -> None:
        self.offset += 1
        rec = Record(self.offset, t, 1, kind, group, rank, payload, 0)
        self.machine.step(rec)

    def form(self, group: str, n: int) -> None:
        self.step(T0, "group_created", group, None, {"world_size": n, "config": {}})
        for r in range(n):
            self.step(T0, "join", group, r, {"incarnation": f"i{r}"})
        for r in range(n):
            links = {"incarnation": f"i{r}", "peers": {}, "self_ready": True}
            self.step(T0, "links", group, r, links)
        for r in range(n):
            self.step(T0, "ack", group, r, {"incarnation": f"i{r}", "version": 1})
        self.reads.publish()


def _capture_everything(machine: Coordinator) -> None:
    """What a cycle with a record naming no group published before the fold noted what its
    steps changed: every group captured again, the proposals copied."""
    for g in machine.group_states.values():
        GroupCapture(g)
    dict(proposals_of(machine))


def _cpu(fn: Any) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


def run(quick: bool) -> list[Result]:
    f = _Fold()
    f.form("large", LARGE)
    f.form("small", SMALL)
    assert f.reads.current.current_view("large").version == 1  # type: ignore[union-attr]
    every = {"ranks": rank_sets.encode(range(LARGE))}
    beat_step, beat_publish = [], []
    named_publish, named_render = [], []
    other_publish = []
    tick_publish, tick_before = [], []
    rounds = 3 if quick else 10
    for i in range(rounds):
        t = T0 + (i + 1) * S
        beat_step.append(_cpu(lambda t=t: f.step(t, "heartbeat", "large", None, every)))
        beat_publish.append(_cpu(f.reads.publish))
        report = {"incarnation": "i0", "peers": {}, "self_ready": True}
        f.step(t, "links", "large", 0, report)
        named_publish.append(_cpu(f.reads.publish))
        state = f.machine.group_states["large"]
        named_render.append(_cpu(lambda state=state: group_status(GroupCapture(state))))
        f.step(t, "links", "small", 0, report)
        other_publish.append(_cpu(f.reads.publish))
        # the small group beats too, so that no deadline is due at the tick
        f.step(t, "heartbeat", "small", None, {"ranks": rank_sets.encode(range(SMALL))})
        f.reads.publish()
        f.step(t, "tick", None, None, {})
        tick_publish.append(_cpu(f.reads.publish))
        tick_before.append(_cpu(lambda: _capture_everything(f.machine)))
    extra = {"rounds": rounds, "ranks": LARGE}
    return [
        Result(
            bench="reads",
            metric=f"{LARGE}-rank group: publish after a cycle of its heartbeats",
            unit="ms (CPU)",
            median=median(beat_publish),
            baseline="the cycle's fold step (one shared heartbeat record)",
            baseline_median=median(beat_step),
            ratio=lower_is_better_ratio(median(beat_publish), median(beat_step)),
            extra=extra,
        ),
        Result(
            bench="reads",
            metric=f"{LARGE}-rank group: publish after a cycle that names it",
            unit="ms (CPU)",
            median=median(named_publish),
            baseline="rendering its status from its state (a read, before the read model)",
            baseline_median=median(named_render),
            ratio=lower_is_better_ratio(median(named_publish), median(named_render)),
            extra=extra,
        ),
        Result(
            bench="reads",
            metric=f"publish after a cycle that names only a {SMALL}-rank group "
            f"(the {LARGE}-rank one shared)",
            unit="ms (CPU)",
            median=median(other_publish),
            extra=extra,
        ),
        Result(
            bench="reads",
            metric=f"{LARGE}-rank group: publish after a tick with no deadline due "
            "(a record that names no group)",
            unit="ms (CPU)",
            median=median(tick_publish),
            baseline="capturing every group again and copying the proposals (such a cycle before)",
            baseline_median=median(tick_before),
            ratio=lower_is_better_ratio(median(tick_publish), median(tick_before)),
            extra=extra,
        ),
    ]
