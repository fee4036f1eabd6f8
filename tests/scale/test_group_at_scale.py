"""A group of 8,192 ranks, in process: the real ``Host`` on a real SQLite file behind the real
HTTP app, and 8,192 real ``AgentMachine``s in simulated hosts of 8 ranks (``agent.simhost``),
speaking the host channel, and again over the plain HTTP endpoints.

It forms, loses one rank (killed, its death reported by the supervisor), and every survivor
reaches the new view with no agent stopped; every survivor's view, folded from the deltas it
received, equals the coordinator's. This is the size at which protocol 1 died right after
formation (a links report over the payload limit)."""

from __future__ import annotations

import pytest

from foldplane.agent.simhost import SimulatedCluster
from tests.scale.harness import create_group, serving

N = 8192
GENEROUS = {
    "heartbeat_timeout_s": 60.0,
    "ack_timeout_s": 60.0,
    "admission_timeout_s": 60.0,
    "formation_timeout_s": 300.0,
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "http"])
async def test_8192_ranks_form_lose_one_and_every_survivor_reaches_the_next_view(
    tmp_path, channel: bool
):
    async with serving(tmp_path / "log.db") as (host, address):
        await create_group(host, "big", N, **GENEROUS)
        cluster = SimulatedCluster(address, "big", N, ranks_per_host=8, channel=channel)
        await cluster.start()
        try:
            await cluster.wait_until(lambda: cluster.all_on(1), timeout=300)
            formed = host.machine.current_view("big")
            assert formed.version == 1 and len(formed.active_ranks) == N
            assert cluster.stopped == {}

            victim = 4321
            cluster.kill(victim)
            status, answer = await cluster.report_death(victim)
            assert status == 200, answer
            await cluster.wait_until(lambda: cluster.all_on(2), timeout=300)

            view = host.machine.current_view("big")
            assert view.version == 2
            assert victim not in view.active_ranks and len(view.active_ranks) == N - 1
            assert view.rank_states[victim] == "OFFLINE"
            assert cluster.stopped == {}  # no agent stopped, none refused
            for rank in cluster.live_ranks:
                assert cluster.view(rank) == view
            # no links report went over the limit: every one was accepted
            assert host.metrics.fenced.get("invalid_event", 0) == 0
        finally:
            await cluster.stop()
