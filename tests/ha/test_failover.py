"""Failover end to end: real coordinator processes on the real PostgreSQL, real signals.

- SIGKILL the leader under load: the standby serves writes, every acknowledged record is still
  in the log, the agents carry on without joining again, the view history has no gap or fork.
  The agents are simulated hosts (``agent.simhost``: the real ``AgentMachine`` per rank) over
  the list of both addresses, following ``503 not_leader`` as the real client does.
- SIGSTOP the leader past its lease, let the standby take over, SIGCONT it: its writes are
  refused, it steps down, and nothing it did after losing the term is in the log.
- Coordinators started at once on an empty database: exactly one leads, one term is claimed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import httpx
import pytest
from msgspec import to_builtins

from foldplane.agent.client import CoordinatorClient
from foldplane.agent.simhost import SimulatedCluster
from foldplane.wire import ranks as rank_sets
from foldplane.wire.protocol import PROTOCOL
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
#: Beats share a record for at most this long on the nodes of the load test (many writes).
FLUSH = ("--heartbeat-flush-s", "0.05")

T = TypeVar("T")


class Agents:
    """A :class:`SimulatedCluster` running in an event loop of its own thread, so the test's
    blocking steps (signals, waits on ``/healthz``) never stall it. It records the versions
    each rank installed, in order, and keeps every answered event (``host.sent``)."""

    def __init__(self, addresses: list[Node], group: str, world_size: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.seen: dict[int, list[int]] = {r: [] for r in range(world_size)}
        #: every answered event, taken once the cluster stopped
        self.final: list[tuple[Mapping[str, Any], Mapping[str, Any]]] | None = None
        where = [("127.0.0.1", node.port) for node in addresses]
        self.cluster: SimulatedCluster = self.run(self._start(where, group, world_size))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(
        self, where: list[tuple[str, int]], group: str, world_size: int
    ) -> SimulatedCluster:
        cluster = SimulatedCluster(where, group, world_size, heartbeat_interval_s=0.1)
        for host in cluster.hosts:
            host.sent = []
        await cluster.start()
        self._recorder = self.loop.create_task(self._record(cluster))
        return cluster

    async def _record(self, cluster: SimulatedCluster) -> None:
        def note() -> bool:  # called on every view installed
            for rank, seen in self.seen.items():
                view = cluster.view(rank)
                if view is not None and (not seen or seen[-1] != view.version):
                    seen.append(view.version)
            return False

        await cluster.wait_until(note, timeout=3600)

    def wait_version(self, version: int, timeout: float = 30.0) -> None:
        """Every rank installed ``version`` (woken by each view installed)."""
        self.run(self.cluster.wait_until(lambda: self.cluster.all_on(version), timeout), None)

    def sent(self) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
        return self.final if self.final is not None else self.run(self._sent())

    async def _sent(self) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
        # as the wire carried them
        return [(to_builtins(e), r) for host in self.cluster.hosts for e, r in host.sent or []]

    def acked(self, since: int = 0) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
        """The writes acknowledged (durable at their offset), from the ``since``-th answer on."""
        return [(e, r) for e, r in self.sent()[since:] if "offset" in r and "error" not in r]

    def stop(self) -> None:
        try:
            self._recorder.cancel()
            self.run(self.cluster.stop())
            self.final = self.run(self._sent())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def _leader_and_standby(nodes: Callable[..., Node], *args: str) -> tuple[Node, Node]:
    a = nodes(*args).start()
    a.wait_ready()
    a.wait_role("leader")  # it serves as a standby until its first claim wins
    b = nodes(*args).start()
    health = b.wait_ready()
    assert health["role"] == "standby"
    assert health["leader"] == a.url
    return a, b


def _versions(views: list[dict[str, Any]]) -> list[int]:
    return [v["version"] for v in views]


def test_sigkill_leader_under_load(nodes: Callable[..., Node], schema: str) -> None:
    a, b = _leader_and_standby(nodes, *FLUSH)
    operator = CoordinatorClient([a.url, b.url], timeout_s=2.0)
    retrying(lambda: operator.create_group("train", 3, **GROUP))
    agents = Agents([a, b], "train", 3)
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
        wait_for(lambda: len(agents.acked()) > 50, 20, "heartbeats to be acknowledged")

        a.kill()
        answered_before_kill = len(agents.sent())
        health = b.wait_role("leader", TAKEOVER_DEADLINE_S)
        assert health["term"] > term_before
        wait_for(lambda: agents.acked(answered_before_kill), TAKEOVER_DEADLINE_S, "a write on B")

        # The agents carry on: a view change on the new leader goes through their ACKs.
        applied = retrying(lambda: operator.propose("train", "activate", [2], idempotency_key="a"))
        assert applied["status"] == "applied", applied
        assert applied["version"] == 3
        agents.wait_version(3)
        wait_for(lambda: len(agents.acked(answered_before_kill)) > 20, 20, "heartbeats on B")
        stopped = agents.cluster.stopped
        resyncs = httpx.get(b.url + "/metrics", timeout=10).text
    finally:
        agents.stop()

    # Every acknowledged write is in the log, at the offset it was acknowledged with.
    log = {e["offset"]: e for e in b.events()}
    assert sorted(log) == list(range(1, len(log) + 1)), "offsets are gap-free"
    acked = agents.acked()
    assert {e["type"] for e, _ in acked} >= {"join", "links", "ack", "heartbeat"}
    for event, result in acked:
        record = log[result["offset"]]
        assert record["kind"] == event["type"], (event, record)
        if event["type"] == "heartbeat":  # a shared record naming every rank in it
            assert record["rank"] is None, record
            assert event["rank"] in rank_sets.decode(record["payload"]["ranks"], 3), record
        else:
            assert record["rank"] == event["rank"], (event, record)
            assert record["payload"]["incarnation"] == event["incarnation"], (event, record)
    terms = [log[o]["term"] for o in sorted(log)]
    assert terms == sorted(terms), "a term never goes back in the log"
    assert terms[-1] == health["term"]

    # No rejoin, no lost rank: each rank saw every view once, in order.
    assert not stopped, stopped  # no agent gave up
    answered = agents.sent()
    assert sorted(e["rank"] for e, _ in answered if e["type"] == "join") == [0, 1, 2]
    assert sum(e["kind"] == "join" for e in log.values()) == 3
    assert not [r for _, r in answered if r.get("error") == "rank_offline"]
    assert all(seen == [1, 2, 3] for seen in agents.seen.values()), agents.seen
    # the standby's journals held every update the agents resumed after
    assert "\nfoldplane_updates_resync_total 0.0\n" in "\n" + resyncs, resyncs

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

    # An agent that read B's log up to its head, then polls A (it woke, and has not yet
    # learnt that it lost the lease): A's fold ends before that offset, which the log holds.
    # A must not answer from its fold, least of all as a log restored from an older copy
    # (the agent would drop its view and install an older one): 503 not_leader, like a write.
    query = f"group=before&rank=0&after={head_at_takeover}&protocol={PROTOCOL}&timeout=1"
    poll = socket.create_connection(("127.0.0.1", a.port), timeout=60)  # the kernel accepts it
    poll.sendall(
        f"GET /agents/updates?{query} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode()
    )
    # ...and a host channel that opens there past A's fold, the same way
    query = f"group=before&ranks=0&after={head_at_takeover}&protocol={PROTOCOL}"
    channel = socket.create_connection(("127.0.0.1", a.port), timeout=60)
    channel.sendall(
        f"GET /agents/channel?{query} HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\n"
        "connection: Upgrade\r\nsec-websocket-version: 13\r\n"
        f"sec-websocket-key: {base64.b64encode(bytes(16)).decode()}\r\n\r\n".encode()
    )

    a.resume()
    sender.join(timeout=30)
    assert late, "the write sent to the frozen leader got no answer"
    assert late["status"] == 503 and late["body"]["error"] == "not_leader", late
    with poll:
        answer = b"".join(iter(lambda: poll.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), answer
    assert json.loads(body)["error"] == "not_leader", answer
    # the channel is refused at its opening (503) or, opened, gets the error and a close 1013
    with channel:
        answer = b"".join(iter(lambda: channel.recv(65536), b""))
    assert re.search(rb'"error": ?"not_leader"', answer) and b"restored" not in answer, answer
    assert answer.startswith(b"HTTP/1.1 503 ") or re.search(rb"\x88.\x03\xf5", answer), answer

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
