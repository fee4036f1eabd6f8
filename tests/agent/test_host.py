"""The agent host against a real coordinator server: in-process Agents with real data planes.

Formation and a collective, a coordinator restart in the middle (the agents resume after their
last offset), fencing of a stale incarnation, clean exits, and the errors a user sees.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from foldplane.agent import Agent, AgentStopped
from foldplane.agent.client import CoordinatorClient, CoordinatorUnavailable
from tests.agent.conftest import Coordinator, start_coordinator, stop_coordinator
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(120)


def agents(url: str, group: str, ranks: list[int], **kw) -> list[Agent]:
    return [Agent(url, group=group, rank=r, heartbeat_interval_s=0.2, **kw).start() for r in ranks]


def all_reduce_everywhere(members: list[Agent]) -> list[tuple[bool, float]]:
    """One all_reduce on every agent's process group at once (one thread per rank)."""
    out: list[tuple[bool, float]] = [(False, 0.0)] * len(members)

    def one(i: int) -> None:
        scale = 10.0 if members[i].group == "right" else 1.0
        t = torch.full((2,), scale * (members[i].rank + 1))
        ok = members[i].process_group().all_reduce(t, async_op=True).wait()
        out[i] = (ok, t[0].item())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(members))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return out


def close_all(members: list[Agent]) -> None:
    for a in members:
        a.close()


def test_two_agents_form_a_group_run_a_collective_and_leave_cleanly(coordinator: Coordinator):
    coordinator.create_group("pair", 2)
    pair = agents(coordinator.url, "pair", [0, 1])
    try:
        views = [a.wait_for_view(timeout=60) for a in pair]
        assert [(v.version, v.active_ranks) for v in views] == [(1, (0, 1))] * 2
        assert all(a.state == "HEALTHY" for a in pair) or pair[0].wait_for_state("HEALTHY", 10)
        assert all_reduce_everywhere(pair) == [(True, 3.0), (True, 3.0)]
    finally:
        close_all(pair)
    assert [a.stopped.reason for a in pair if a.stopped] == ["closed", "closed"]
    ranks = coordinator.status("pair")["ranks"]
    assert [(r["state"], r["exited"]) for r in ranks] == [("OFFLINE", True)] * 2


def test_two_groups_share_the_coordinator_store_without_colliding(coordinator: Coordinator):
    """A failed view 1 of one group leaves poison keys in the store; another group's view 1
    must not see them (without a per-group prefix it would fail at once)."""
    coordinator.create_group("left", 2, auto_deactivate_on_failure=False)
    coordinator.create_group("right", 2)
    left = agents(coordinator.url, "left", [0, 1])
    right: list[Agent] = []
    try:
        for a in left:
            assert a.wait_for_view(timeout=60).version == 1
        assert all_reduce_everywhere(left) == [(True, 3.0)] * 2
        left[0].data_plane.inject_link_failure(1)
        assert [ok for ok, _ in all_reduce_everywhere(left)] == [False, False]

        right = agents(coordinator.url, "right", [0, 1])
        for a in right:
            assert a.wait_for_view(timeout=60).version == 1
        assert all_reduce_everywhere(right) == [(True, 30.0)] * 2  # 10 + 20
    finally:
        close_all(left + right)


def test_agents_resume_after_their_last_offset_when_the_coordinator_restarts(tmp_path: Path):
    first = start_coordinator(tmp_path)
    port = first.url.rsplit(":", 1)[1]
    # Generous: no heartbeat can arrive while the coordinator is down (and it restarts slowly
    # on a loaded machine).
    first.create_group("restart", 2, heartbeat_timeout_s=120.0)
    pair = agents(first.url, "restart", [0, 1])
    try:
        for a in pair:
            a.wait_for_view(timeout=60)
        offsets = [a._machine.after for a in pair]
        stop_coordinator(first)

        second = start_coordinator(tmp_path, port=int(port))
        try:
            outcome = pair[0].deactivate_ranks([1], wait_s=30)
            assert (outcome["status"], outcome["version"]) == ("applied", 2), str(outcome)
            for a in pair:
                assert a.wait_for_view(2, timeout=30).active_ranks == (0,)
                assert a._machine.after > max(offsets)
            assert all(a.stopped is None for a in pair)  # neither was fenced nor failed
            history = second.history("restart")
            assert [(v["version"], v["active_ranks"]) for v in history] == [(1, [0, 1]), (2, [0])]
        finally:
            close_all(pair)
            stop_coordinator(second)
    finally:
        close_all(pair)


def test_a_replacement_is_refused_while_the_old_incarnation_lives_then_fences_it(
    coordinator: Coordinator,
):
    coordinator.create_group("fence", 2, heartbeat_timeout_s=30.0)
    pair = agents(coordinator.url, "fence", [0, 1])
    newcomer = None
    try:
        for a in pair:
            a.wait_for_view(timeout=60)
        old = pair[1]
        newcomer = Agent(coordinator.url, group="fence", rank=1, heartbeat_interval_s=0.2).start()
        # rank_busy: the old incarnation is HEALTHY and heartbeating; the newcomer keeps trying.
        with pytest.raises(TimeoutError, match="rank_busy"):
            newcomer.wait_for_state("SYNCED", timeout=1.0)
        coordinator.client.report_death("fence", 1, old.incarnation)
        # The old process is alive, but a reported death is not contested: it stops.
        with pytest.raises(AgentStopped, match="death reported"):
            old.wait_for_view(lambda v: False, timeout=30)
        assert old.stopped is not None and old.stopped.reason == "fenced"
        newcomer.wait_for_state("HEALTHY", timeout=30)
        assert coordinator.rank("fence", 1)["incarnation"] == newcomer.incarnation
    finally:
        close_all(pair + ([newcomer] if newcomer else []))


def test_the_agent_takes_its_identity_from_the_environment(monkeypatch, coordinator: Coordinator):
    coordinator.create_group("env", 1)
    monkeypatch.setenv(
        "FOLDPLANE_COORDINATOR", f"http://127.0.0.1:{free_port()}, {coordinator.url}"
    )
    monkeypatch.setenv("FOLDPLANE_GROUP", "env")
    monkeypatch.setenv("FOLDPLANE_RANK", "0")
    monkeypatch.setenv("FOLDPLANE_INCARNATION", "inc-from-launcher")
    agent = Agent(heartbeat_interval_s=0.2).start()  # the first address is dead: the second serves
    try:
        assert (agent.group, agent.rank, agent.world_size) == ("env", 0, 1)
        assert agent.wait_for_view(timeout=60).active_ranks == (0,)
        assert coordinator.rank("env", 0)["incarnation"] == "inc-from-launcher"
    finally:
        agent.close()


def test_errors_name_what_is_wrong(monkeypatch, coordinator: Coordinator):
    for name in ("FOLDPLANE_COORDINATOR", "FOLDPLANE_GROUP", "FOLDPLANE_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        ValueError, match=r"group \(or FOLDPLANE_GROUP\), rank \(or FOLDPLANE_RANK\)"
    ):
        Agent(coordinator.url)
    monkeypatch.setenv("FOLDPLANE_RANK", "two")
    with pytest.raises(ValueError, match="FOLDPLANE_RANK='two'"):
        Agent(coordinator.url, group="g")
    with pytest.raises(ValueError, match="must start with http"):
        Agent("127.0.0.1:8470", group="g", rank=0)

    coordinator.create_group("small", 2)
    with pytest.raises(
        ValueError, match=r"rank 5 is out of range for group 'small' \(world_size 2"
    ):
        Agent(coordinator.url, group="small", rank=5).start()
    with pytest.raises(RuntimeError, match=r"no group 'nope' at .* \(groups: small\)"):
        Agent(coordinator.url, group="nope", rank=0).start(timeout_s=0.3)
    agent = Agent(coordinator.url, group="small", rank=0)
    with pytest.raises(RuntimeError, match="call agent.start"):
        agent.process_group()


def test_a_wrong_agent_token_stops_the_agent_with_forbidden(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("FOLDPLANE_SECRET", "s3cret")
    monkeypatch.setenv("FOLDPLANE_TOKEN", "operator-token")
    secured = start_coordinator(tmp_path)
    monkeypatch.delenv("FOLDPLANE_SECRET")
    try:
        operator = CoordinatorClient(secured.url, token="operator-token")
        operator.create_group("auth", 1)
        from foldplane.wire.auth import agent_token

        wrong = agent_token("other-secret", "auth", 0)
        agent = Agent(secured.url, group="auth", rank=0, token=wrong).start()
        with pytest.raises(AgentStopped, match="forbidden"):
            agent.wait_for_view(timeout=30)
        assert agent.stopped is not None and agent.stopped.reason == "failed"
        agent.close()

        good = Agent(secured.url, group="auth", rank=0, token=agent_token("s3cret", "auth", 0))
        try:
            assert good.start().wait_for_view(timeout=60).version == 1
        finally:
            good.close()
        operator.close()
    finally:
        stop_coordinator(secured)


def test_no_coordinator_at_any_address_is_reported_with_each_address():
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    client = CoordinatorClient(dead, timeout_s=1.0)
    with pytest.raises(CoordinatorUnavailable) as err:
        client.healthz()
    assert all(url in str(err.value) for url in dead)
    client.close()
