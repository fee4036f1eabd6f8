"""Real worker processes (gloo on CPU) under the launcher's per-host relay.

The launcher runs the relay by default, so these workers' agents send their events and poll
their updates through it; the test reads the relay's counters to see that the coordinator sent
the whole host's updates on one channel and that the workers' events shared batches.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ALL = [0, 1, 2, 3]


def test_workers_under_the_relay_form_and_survivors_of_a_sigkill_reach_the_next_view(
    workers, coordinator
):
    w = workers("relayed", 4)
    relay = w.launcher.relay
    assert relay is not None
    for r in ALL:
        w.expect(r, "started")
    views = w.ask(ALL, "wait_view", "view", active=ALL)
    assert {v["version"] for v in views.values()} == {1}
    first = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(res["ok"] and res["value"] == 10.0 for res in first.values()), str(first)

    # Every rank is carried by the lane's one channel now: from here on, no poll of a worker
    # goes upstream on its own (and never was more than one lane channel open).
    formed = dict(relay.stats)
    w.launcher.kill(3)
    death = w.exits.get(timeout=30)
    assert (death.rank, death.returncode, death.reported) == (3, -9, True), death
    w.ask([0, 1, 2], "wait_view", "view", active=[0, 1, 2])
    after = w.ask([0, 1, 2], "all_reduce", "all_reduce")
    for r, res in after.items():
        assert res["ok"] and res["value"] == 6.0 and res["version"] == 2, (r, res)

    stats = dict(relay.stats)
    assert stats["polls_solo"] == formed["polls_solo"], (formed, stats)
    assert stats["polls_lane"] > formed["polls_lane"], (formed, stats)
    assert stats["lane_channels_max"] == 1, stats
    # the lane's pushes answered the workers' polls (each update came once for the host)
    assert stats["lane_pushes"] > formed["lane_pushes"], (formed, stats)
    assert stats["lane_channels"] < stats["polls_lane"], stats
    # the workers' events shared upstream batches (the ACKs of one prepare arrive together)
    assert stats["events_merged"] >= 1, stats
    assert stats["events_upstream"] < stats["events_requests"], stats

    history = coordinator.history("relayed")
    assert [(v["version"], v["active_ranks"]) for v in history] == [(1, ALL), (2, [0, 1, 2])]
