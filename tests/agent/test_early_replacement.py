"""A replacement that starts before the coordinator has seen the end of the process it
replaces (torchrun, Slurm or Kubernetes restarting it at once, no foldplane launcher): the view
it reads first lists its rank for that process. It must not take itself for a member of that
view (``Agent.is_active``); once the old process is gone its join is appended, the next view
leaves the rank out, and its activation takes it in.

Real agents (in this process, on the gloo data plane) against a real ``coordinator serve``.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from foldplane.agent import Agent
from tests.service.conftest import make_server

#: no timeout trips by accident: the old rank 2 leaves by its own exit
CALM = {
    "heartbeat_timeout_s": 60.0,
    "ack_timeout_s": 20.0,
    "admission_timeout_s": 30.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.05,
}


def test_a_replacement_started_before_the_death_is_seen_is_activated_not_taken_in(
    tmp_path: Path,
) -> None:
    srv = make_server(tmp_path, store=True).start()
    agents: list[Agent] = []
    try:
        r = httpx.post(srv.url + "/groups", json={"group": "g", "world_size": 3, **CALM})
        assert r.status_code == 201, r.text
        agents = [
            Agent(srv.url, group="g", rank=r, heartbeat_interval_s=0.5).start() for r in range(3)
        ]
        for a in agents:
            a.wait_for_view(1, timeout=60)
            assert a.is_active()

        # rank 2's replacement starts while the old process still holds the rank: its join is
        # refused as busy and retried, and the view it reads lists rank 2 for the old process
        replacement = Agent(srv.url, group="g", rank=2, heartbeat_interval_s=0.5).start()
        agents.append(replacement)
        first = replacement.wait_for_view(timeout=60)
        assert first.version == 1 and 2 in first.active_ranks
        assert not replacement.is_active()  # the check examples/train_ddp.py makes at start
        # the old process goes (here by exiting; a death reported or timed out is the same):
        # the replacement's join is appended and the next view leaves rank 2 out
        agents[2].close()
        out = replacement.wait_for_view(lambda v: 2 not in v.active_ranks, timeout=60)
        assert out.version == 2 and not replacement.is_active()

        # the example's logic: a rank that is not active asks to be activated
        replacement.wait_for_state("HEALTHY", timeout=60)
        proposal = replacement.activate_ranks([2])
        assert proposal["status"] == "applied", proposal
        now = replacement.wait_for_view(lambda v: v.version > out.version, 60)
        assert now.version == 3 and 2 in now.active_ranks, now
        assert replacement.is_active()
        plane = replacement.data_plane
        assert plane is not None and plane.view_for_op("test").active
    finally:
        for a in agents:
            a.close()
        srv.stop()
