"""A view that fails with every member alive, with the elastic DDP on real gloo processes: a
rank whose training thread stalls past the collective timeout (its process, heartbeats and
liveness counter all alive) makes the step's all-reduce time out blaming nobody.

The coordinator resolves it (``coordinator.fold.stalls``): a stall once is retried on a fresh
view with the same members and training goes on with everyone; a rank that stalls again on the
retry is the laggard the evidence names, and training goes on without it. Without the rule the
members skipped a step every collective timeout for as long as the stall lasted, and for ever
on a view that nothing replaced."""

from __future__ import annotations

import pytest

from tests.agent.test_ddp import DDP_WORKER, check_step, collect, steps_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]

TIMEOUT_S = 2.0


def by_index(events: dict[int, list[dict]]) -> list[dict[int, dict]]:
    """The committed steps, each as its members saw it, in order."""
    steps: dict[tuple[int, int], dict[int, dict]] = {}
    for rank, evs in events.items():
        for e in evs:
            if e["committed"]:
                steps.setdefault((e["version"], e["index"]), {})[rank] = e
    return [steps[k] for k in sorted(steps)]


def test_ddp_a_step_stalled_once_is_retried_on_a_new_view_with_every_member(workers, coordinator):
    w = workers("stall-once", 3, collective_timeout_s=TIMEOUT_S, script=DDP_WORKER)
    for r in range(3):
        w.expect(r, "started")
    steps_of(w, [0, 1, 2], 2)
    w.send([0, 1], "steps", until=6)
    w.send(2, "steps", until=6, stall_s=1.5 * TIMEOUT_S, stall_steps=1)
    events = {r: collect(w, r, 6) for r in range(3)}

    history = coordinator.history("stall-once")
    causes = [(v["version"], v["cause"]["kind"], v["active_ranks"]) for v in history]
    assert causes == [(1, "formation", [0, 1, 2]), (2, "view_retry", [0, 1, 2])], causes
    assert any(not e["committed"] and e["version"] == 1 for e in events[0])  # the stalled step
    committed = by_index(events)
    assert len(committed) == 4 and committed[-1][0]["version"] == 2
    for step in committed:
        assert sorted(step) == [0, 1, 2] and step[0]["members"] == [0, 1, 2]
        check_step(step)


def test_ddp_a_rank_that_stalls_again_on_the_retry_is_let_go(workers, coordinator):
    w = workers("stall-again", 3, collective_timeout_s=TIMEOUT_S, script=DDP_WORKER)
    for r in range(3):
        w.expect(r, "started")
    steps_of(w, [0, 1, 2], 2)
    w.send([0, 1], "steps", until=5)
    w.send(2, "steps", n=2, stall_s=4 * TIMEOUT_S, stall_steps=2)
    events = {r: collect(w, r, 5) for r in (0, 1)}
    collect(w, 2, 2)

    history = coordinator.history("stall-again")
    causes = [(v["version"], v["cause"]["kind"], v["active_ranks"]) for v in history]
    assert causes == [
        (1, "formation", [0, 1, 2]),
        (2, "view_retry", [0, 1, 2]),
        (3, "view_failed", [0, 1]),
    ], causes
    assert "ranks [2] had issued fewer" in history[2]["cause"]["detail"]
    committed = by_index(events)
    assert len(committed) == 3
    for step in committed:
        assert step[0]["version"] == 3 and step[0]["members"] == [0, 1]
        check_step(step)
