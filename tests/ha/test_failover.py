"""Failover end to end: real coordinator processes on the real PostgreSQL, real signals.

- SIGKILL the leader under load: the standby serves writes, every acknowledged record is still
  in the log, the agents carry on without joining again, the view history has no gap or fork.
- SIGSTOP the leader past its lease, let the standby take over, SIGCONT it: its writes are
  refused, it steps down, and nothing it did after losing the term is in the log.
- Coordinators started at once on an empty database: exactly one leads, one term is claimed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent.client import CoordinatorClient
from tests.ha.agents import AgentHost
from tests.ha.cluster import Node, fetch, replay, retrying, wait_for

#: Real processes and real lease periods: about a minute for the three, so they run with the
#: slow suites (the lease and replica rules run in-process in the default suite).
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(240)]

#: Group settings: failures show within seconds, yet a failover (about a second) trips none.
GROUP = {
    "heartbeat_timeout_s": 5.0,
    "ack_timeout_s": 10.0,
    "admission_timeout_s": 10.0,
    "formation_timeout_s": 60.0,
    "reconcile_window_s": 0.05,
}
#: How long a takeover may take on this shared machine before the test gives up; the
#: benchmark measures the real figure (``python -m benchmarks failover``).
TAKEOVER_DEADLINE_S = 20.0


def _leader_and_standby(nodes: Callable[..., Node]) -> tuple[Node, Node]:
    a = nodes().start()
    a.wait_ready()
    a.wait_role("leader")  # it serves as a standby until its first claim wins
    b = nodes().start()
    health = b.wait_ready()
    assert health["role"] == "standby"
    assert health["leader"] == a.url
    return a, b


def _versions(views: list[dict[str, Any]]) -> list[int]:
    return [v["version"] for v in views]


def test_sigkill_leader_under_load(nodes: Callable[..., Node], schema: str) -> None:
    a, b = _leader_and_standby(nodes)
    operator = CoordinatorClient([a.url, b.url], timeout_s=2.0)
    retrying(lambda: operator.create_group("train", 3, **GROUP))
    agents = AgentHost([a.url, b.url], "train", 3).start()
    try:
        agents.wait_version(1)
        applied = retrying(
            lambda: operator.propose("train", "deactivate", [2], idempotency_key="b")
        )
        assert applied["status"] == "applied", applied
        agents.wait_version(2)
        history_before = a.views("train")
        assert _versions(history_before) == [1, 2]
        term_before = a.health()["term"]
        wait_for(lambda: len(agents.acked) > 50, 20, "heartbeats to be acknowledged")

        a.kill()
        killed_at = time.monotonic()
        health = b.wait_role("leader", TAKEOVER_DEADLINE_S)
        assert health["term"] > term_before
        wait_for(lambda: agents.acked_after(killed_at), TAKEOVER_DEADLINE_S, "a write on B")

        # The agents carry on: a view change on the new leader goes through their ACKs.
        applied = retrying(lambda: operator.propose("train", "activate", [2], idempotency_key="a"))
        assert applied["status"] == "applied", applied
        assert applied["version"] == 3
        agents.wait_version(3)
        wait_for(lambda: len(agents.acked_after(killed_at)) > 20, 20, "heartbeats on B")
    finally:
        agents.stop()

    # Every acknowledged write is in the log, at the offset it was acknowledged with.
    log = {e["offset"]: e for e in b.events()}
    assert sorted(log) == list(range(1, len(log) + 1)), "offsets are gap-free"
    for acked in agents.acked:
        record = log[acked.offset]
        assert (record["kind"], record["rank"]) == (acked.event["type"], acked.event["rank"])
        assert record["payload"]["incarnation"] == acked.event["incarnation"]
    terms = [log[o]["term"] for o in sorted(log)]
    assert terms == sorted(terms), "a term never goes back in the log"
    assert terms[-1] == health["term"]

    # No rejoin, no lost rank: each rank saw every view once, in order.
    assert agents.joins == 1
    assert sum(e["kind"] == "join" for e in log.values()) == 3
    assert not [r for _, r in agents.refused if r.get("error") == "rank_offline"]
    assert all(seen == [1, 2, 3] for seen in agents.committed.values()), agents.committed
    assert agents.resyncs == 0  # the standby's journals held every update they resumed after

    # The history continues the one the old leader served: no gap, no fork.
    history_after = b.views("train")
    assert _versions(history_after) == [1, 2, 3]
    assert history_after[:2] == history_before
    assert history_after[2]["cause"]["kind"] == "proposal"

    # A fold from scratch agrees with every projection either leader wrote.
    checked = replay(schema)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_sigstop_leader_is_fenced_and_steps_down(nodes: Callable[..., Node], schema: str) -> None:
    a, b = _leader_and_standby(nodes)
    operator = CoordinatorClient([a.url, b.url], timeout_s=2.0)
    retrying(lambda: operator.create_group("before", 2, **GROUP))
    term_a = a.health()["term"]

    a.freeze()
    # A write sent to the frozen leader waits in its socket until it runs again.
    late: dict[str, Any] = {}

    def send_late() -> None:
        r = httpx.post(a.url + "/groups", json={"group": "frozen", "world_size": 2}, timeout=60)
        late["status"], late["body"] = r.status_code, r.json()

    sender = threading.Thread(target=send_late)
    sender.start()
    health = b.wait_role("leader", TAKEOVER_DEADLINE_S)
    assert health["term"] > term_a
    # A times out; the client moves on to B.
    retrying(lambda: operator.create_group("after", 2, **GROUP))
    head_at_takeover = b.health()["head"]

    a.resume()
    sender.join(timeout=30)
    assert late, "the write sent to the frozen leader got no answer"
    assert late["status"] == 503 and late["body"]["error"] == "not_leader", late

    # It stepped down and follows the new leader.
    standby = wait_for(
        lambda: (h := a.health()) is not None and h["role"] == "standby" and h["leader"] and h,
        TAKEOVER_DEADLINE_S,
        "the old leader to step down",
    )
    assert standby["leader"] == b.url
    r = httpx.post(a.url + "/groups", json={"group": "again", "world_size": 2}, timeout=10)
    assert r.status_code == 503
    assert r.json()["error"] == "not_leader" and r.json()["leader"] == b.url

    # Nothing it did after losing the term is anywhere: not in the log, not in a projection.
    rows = asyncio.run(fetch(schema, "SELECT seq, term, kind, grp FROM log ORDER BY seq"))
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert "frozen" not in {r["grp"] for r in rows}
    assert max(r["seq"] for r in rows if r["term"] == term_a) < min(
        r["seq"] for r in rows if r["term"] > term_a
    )
    assert not [r for r in rows if r["term"] == term_a and r["seq"] > head_at_takeover]
    groups = asyncio.run(fetch(schema, "SELECT grp FROM projection WHERE kind = 'group'"))
    assert {g["grp"] for g in groups} == {"before", "after"}
    wait_for(lambda: a.health()["fold_offset"] == b.health()["head"], 10, "A to fold the new term")
    assert a.get("/groups/after")["group"] == "after"  # reads are served by the standby
    checked = replay(schema)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_coordinators_started_at_once_elect_exactly_one(
    nodes: Callable[..., Node], schema: str
) -> None:
    started = [nodes() for _ in range(3)]
    for node in started:
        node.start()
    for node in started:
        node.wait_ready()

    def one_leader() -> tuple[Node, list[dict[str, Any]]] | None:
        healths = [node.health() for node in started]
        leaders = [n for n, h in zip(started, healths, strict=True) if h and h["role"] == "leader"]
        standbys = [h for h in healths if h and h["role"] == "standby"]
        named = len(leaders) == 1 and all(h["leader"] == leaders[0].url for h in standbys)
        return (leaders[0], healths) if named and len(standbys) == 2 else None

    leader, healths = wait_for(one_leader, 30, "one leader and two standbys naming it")
    # Stable, not right once: across several renewals no two nodes lead the same term.
    renewals: set[Any] = set()
    deadline = time.monotonic() + 30
    while len(renewals) < 4:
        healths = [node.health() for node in started]
        leading = [h["term"] for h in healths if h and h["role"] == "leader"]
        assert len(leading) == len(set(leading)), healths
        renewals |= {
            r["expires_at"]
            for r in asyncio.run(fetch(schema, "SELECT expires_at FROM leader_lease"))
        }
        assert time.monotonic() < deadline, f"the lease was renewed only {len(renewals)} times"

    # Every term was taken by exactly one node; the first by exactly one of the three.
    claims = sorted(t for node in started for t in node.terms_led())
    assert claims == list(range(1, len(claims) + 1)), [n.terms_led() for n in started]
    assert sum(1 in node.terms_led() for node in started) == 1
    lease = asyncio.run(fetch(schema, "SELECT generation, address, term FROM leader_lease"))
    head = asyncio.run(fetch(schema, "SELECT term FROM log_head"))
    assert head[0]["term"] == lease[0]["term"] == claims[-1]
    assert lease[0]["generation"] == len(claims)
