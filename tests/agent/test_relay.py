"""The per-host relay against a real coordinator server: batching, tokens, the lane's channel.

The "workers" here speak the agent wire protocol to the relay over HTTP from threads of the
test, so each test controls exactly who sends what; the relay speaks to the coordinator over
host channels. `test_relay_workers.py` runs real worker processes under the launcher's relay.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from foldplane.agent.client import CoordinatorClient
from foldplane.agent.relay import EventsRequest, Relay, with_token
from foldplane.wire.auth import agent_token
from tests.agent.conftest import Coordinator, start_coordinator, stop_coordinator

pytestmark = pytest.mark.timeout(120)

SECRET = "relay-secret"
OPERATOR = "relay-operator"


@pytest.fixture
def coordinator(module_coordinator: Coordinator) -> Coordinator:
    return module_coordinator  # every test uses a group of its own


@pytest.fixture
def relay(coordinator: Coordinator) -> Iterator[Relay]:
    with Relay(coordinator.url) as r:
        yield r


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """A coordinator with auth on: the operator token and per-rank agent tokens."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FOLDPLANE_SECRET", SECRET)
    mp.setenv("FOLDPLANE_TOKEN", OPERATOR)
    try:
        c = start_coordinator(tmp_path_factory.mktemp("secured"))
    finally:
        mp.undo()
    c.client.close()
    c.client = CoordinatorClient(c.url, token=OPERATOR, timeout_s=30.0)
    yield c
    stop_coordinator(c)


class Rank:
    """One rank's agent, speaking the wire protocol to ``url`` (the relay or the coordinator)."""

    def __init__(self, url: str, group: str, rank: int, token: str | None = None) -> None:
        self.group, self.rank, self.incarnation = group, rank, f"inc-{group}-{rank}"
        self.token = token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=70.0)
        self.after = 0
        self.seen: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "type": kind,
            "group": self.group,
            "rank": self.rank,
            "incarnation": self.incarnation,
            **fields,
        }

    def send(self, *events: dict[str, Any]) -> httpx.Response:
        return self.http.post("/agents/events", json={"events": list(events)})

    def poll(self, timeout: float = 5.0, rank: int | None = None) -> httpx.Response:
        return self.http.get(
            "/agents/updates",
            params={
                "group": self.group,
                "rank": self.rank if rank is None else rank,
                "after": self.after,
                "timeout": timeout,
                "protocol": 2,
            },
        )

    def follow(self, timeout: float = 5.0) -> dict[str, Any]:
        """One poll of its own updates; resumes after what it got."""
        answer = self.poll(timeout)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        self.seen.extend(body["updates"])
        self.after = body["next_after"]
        return body

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for update in self.seen:
                if predicate(update):
                    return update
            left = deadline - time.monotonic()
            assert left > 0, f"rank {self.rank}: no matching update in {self.seen}"
            self.follow(timeout=min(left, 5.0))

    def close(self) -> None:
        self.http.close()


def own_state(rank: int, state: str | None = None) -> Any:
    def match(u: dict[str, Any]) -> bool:
        return (
            u["type"] == "rank_state"
            and u["rank"] == rank
            and (state is None or u["state"] == state)
        )

    return match


def in_parallel(calls: list[Any]) -> list[Any]:
    """Run the calls at once (a barrier releases them together); their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=10)
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


# -- events ----------------------------------------------------------------------------------


def test_events_of_several_workers_share_upstream_requests_and_each_gets_its_own_results(
    coordinator: Coordinator, relay: Relay
):
    coordinator.create_group("batch", 8, heartbeat_timeout_s=600.0)
    ranks = [Rank(relay.url, "batch", r) for r in range(8)]
    joins = in_parallel([lambda r=r: r.send(r.event("join")) for r in ranks])
    offsets = {}
    for r, answer in zip(ranks, joins, strict=True):
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert len(results) == 1 and "offset" in results[0], results
        offsets[results[0]["offset"]] = r.rank
    # each worker's result is the offset of its own join, not of another rank's
    logged = coordinator.client.request("GET", "/events", params={"group": "batch", "kind": "join"})
    assert {e["offset"]: e["rank"] for e in logged["events"]} == offsets

    for _ in range(6):
        beats = in_parallel(
            [lambda r=r: r.send(r.event("heartbeat"), r.event("heartbeat")) for r in ranks]
        )
        for answer in beats:
            assert answer.status_code == 200, answer.text
            assert [("offset" in x) for x in answer.json()["results"]] == [True, True]
    stats = relay.stats
    assert stats["events_requests"] == 8 + 6 * 8
    assert stats["events_upstream"] < stats["events_requests"], stats
    assert stats["events_merged"] >= 1, stats
    # every batch (none has a token: auth is off) went on the one untokened channel
    assert stats["events_channels"] == 1, stats
    for r in ranks:
        r.close()


def test_an_invalid_event_of_one_worker_is_refused_alone(coordinator: Coordinator, relay: Relay):
    coordinator.create_group("refuse", 4, heartbeat_timeout_s=600.0)
    good = [Rank(relay.url, "refuse", r) for r in range(3)]
    bad = Rank(relay.url, "refuse", 3)
    oversized = bad.event("join") | {"incarnation": "x" * 1000}  # over its length limit
    for _ in range(5):
        answers = in_parallel(
            [lambda r=r: r.send(r.event("join")) for r in good] + [lambda: bad.send(oversized)]
        )
        for answer in answers[:3]:
            assert answer.status_code == 200 and "offset" in answer.json()["results"][0]
        assert answers[3].status_code == 200, answers[3].text
        assert answers[3].json()["results"][0]["error"] == "invalid_event", answers[3].text
    for r in (*good, bad):
        r.close()


def test_bad_requests_to_the_relay_get_a_json_error(relay: Relay):
    http = httpx.Client(base_url=relay.url, timeout=10)
    deep: Any = {"type": "heartbeat", "group": "g", "rank": 0}
    for _ in range(40):
        deep = {"type": "heartbeat", "group": "g", "rank": 0, "x": [deep]}
    cases = [
        (http.post("/agents/events", content=b"not json"), 422, "invalid_request"),
        (http.post("/agents/events", json={"events": "no"}), 422, "invalid_request"),
        (http.post("/agents/events", json={"events": [{}] * 4097}), 422, "invalid_request"),
        (http.post("/agents/deaths", json={}), 404, "not_found"),
        (http.get("/views/current", params={"group": "g"}), 404, "not_found"),
        (http.get("/agents/updates", params={"group": "g", "rank": "x"}), 422, "invalid_request"),
        (http.post("/agents/events", content=b"x" * (1024 * 1024 + 1)), 413, "body_too_large"),
        (http.post("/agents/events", json={"events": [deep]}), 400, "nesting_too_deep"),
    ]
    for answer, status, code in cases:
        assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text
        assert answer.json()["detail"]
    # the relay does not read a refused body: it closes the connection after the 413 and says
    # so, or the client would send the next request (the last case) on a shut connection
    too_big = cases[-2][0]
    assert too_big.headers["connection"] == "close"
    assert all(
        "connection" not in answer.headers for answer, _, _ in cases if answer is not too_big
    )
    http.close()


def test_an_unreachable_coordinator_is_a_503_with_the_json_error_body():
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    with Relay(dead, timeout_s=1.0) as relay:
        r = Rank(relay.url, "g", 0)
        for answer in (r.send(r.event("join")), r.poll(timeout=0.5)):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "coordinator_unavailable"
            assert "127.0.0.1:9" in answer.json()["detail"]
        r.close()


# -- updates ---------------------------------------------------------------------------------


def test_one_lane_channel_carries_every_local_rank_and_each_gets_only_its_own_updates(
    coordinator: Coordinator, relay: Relay
):
    coordinator.create_group("lane", 4, heartbeat_timeout_s=600.0)
    ranks = [Rank(relay.url, "lane", r) for r in range(4)]
    for r in ranks:
        assert r.send(r.event("join")).status_code == 200
    for r in ranks:
        r.wait_for(own_state(r.rank, "SYNCED"))
    assert relay.stats["polls_solo"] >= 4  # each rank's first poll proves its own right to it

    # From here on every poll is served from the lane's one channel: the operator reports
    # rank 2 dead, and only rank 2 hears of it.
    before = dict(relay.stats)
    polls = [
        threading.Thread(target=r.wait_for, args=(own_state(2, "OFFLINE"),)) for r in ranks[2:3]
    ]
    for t in polls:
        t.start()
    coordinator.client.report_death("lane", 2, ranks[2].incarnation)
    for t in polls:
        t.join(timeout=60)
    assert any(own_state(2, "OFFLINE")(u) for u in ranks[2].seen)
    for r in (ranks[0], ranks[1], ranks[3]):
        r.follow(timeout=1.0)
        assert all(u.get("rank") in (None, r.rank) for u in r.seen), r.seen
    after = relay.stats
    assert after["polls_solo"] == before["polls_solo"], (before, after)
    assert after["polls_lane"] > before["polls_lane"]
    assert after["lane_channels_max"] == 1, after
    assert after["lane_pushes"] > before["lane_pushes"], (before, after)

    # What the relay served equals what the coordinator says, rank by rank.
    for r in ranks:
        direct = CoordinatorClient(coordinator.url).request(
            "GET",
            "/agents/updates",
            params={"group": "lane", "rank": r.rank, "after": 0, "timeout": 0, "protocol": 2},
        )
        if not direct["resync"]:
            mine = [u for u in direct["updates"] if u["offset"] <= r.after]
            assert r.seen == mine, (r.rank, r.seen, mine)
    for r in ranks:
        r.close()


def test_a_poll_below_what_the_relay_holds_goes_upstream_on_its_own(
    coordinator: Coordinator, relay: Relay
):
    coordinator.create_group("behind", 2, heartbeat_timeout_s=600.0)
    ranks = [Rank(relay.url, "behind", r) for r in range(2)]
    for r in ranks:
        assert r.send(r.event("join")).status_code == 200
        r.wait_for(own_state(r.rank, "SYNCED"))
    for r in ranks:
        r.follow(timeout=0.5)  # both are served by the lane now, which trims what both read
    solo = relay.stats["polls_solo"]
    restarted = Rank(relay.url, "behind", 0)  # a worker that starts again from offset 0
    body = restarted.follow(timeout=1.0)
    assert relay.stats["polls_solo"] == solo + 1
    assert any(own_state(0, "SYNCED")(u) for u in body["updates"]), body
    for r in (*ranks, restarted):
        r.close()


def test_the_cache_stays_within_its_bound_and_every_rank_still_gets_everything(
    coordinator: Coordinator,
):
    coordinator.create_group("small", 3, heartbeat_timeout_s=600.0)
    with Relay(coordinator.url, cache_bytes=600) as relay:
        ranks = [Rank(relay.url, "small", r) for r in range(3)]
        for r in ranks:
            assert r.send(r.event("join")).status_code == 200
            r.wait_for(own_state(r.rank, "SYNCED"))
        # ranks 1 and 2 go OFFLINE and join again, twice, while rank 0 does not read
        for _ in range(2):
            for r in ranks[1:]:
                coordinator.client.report_death("small", r.rank, r.incarnation)
                r.wait_for(own_state(r.rank, "OFFLINE"))
                r.seen.clear()
                assert r.send(r.event("join")).status_code == 200
                r.wait_for(own_state(r.rank, "SYNCED"))
        assert 0 < relay.stats["cache_bytes"] <= 600, relay.stats
        assert relay.stats["cache_dropped"] > 0, relay.stats
        # rank 0 asks from further back than the relay still holds: it gets what the
        # coordinator says (its own death), through a poll of its own
        coordinator.client.report_death("small", 0, ranks[0].incarnation)
        solo, since = relay.stats["polls_solo"], ranks[0].after
        body = ranks[0].follow(timeout=5.0)
        assert relay.stats["polls_solo"] == solo + 1
        direct = CoordinatorClient(coordinator.url).request(
            "GET",
            "/agents/updates",
            params={"group": "small", "rank": 0, "after": since, "timeout": 0, "protocol": 2},
        )
        assert body["updates"] == direct["updates"], (body, direct)
        assert any(own_state(0, "OFFLINE")(u) for u in body["updates"]), body
        assert all(u.get("rank") in (None, 0) for u in body["updates"])
        for r in ranks:
            r.close()


def test_a_push_reaches_a_waiting_worker_poll_at_once(coordinator: Coordinator, relay: Relay):
    coordinator.create_group("prompt", 2, heartbeat_timeout_s=600.0)
    ranks = [Rank(relay.url, "prompt", r) for r in range(2)]
    for r in ranks:
        assert r.send(r.event("join")).status_code == 200
        r.wait_for(own_state(r.rank, "SYNCED"))
    solo = relay.stats["polls_solo"]
    answered: dict[str, Any] = {}

    def poll() -> None:
        answered["body"] = ranks[1].follow(timeout=30.0)  # nothing new yet: it waits

    waiting = threading.Thread(target=poll)
    waiting.start()
    coordinator.client.report_death("prompt", 1, ranks[1].incarnation)
    reported = time.monotonic()
    waiting.join(timeout=40)
    # the push woke the poll: it did not wait out its 30 s
    assert time.monotonic() - reported < 10.0, answered
    assert any(own_state(1, "OFFLINE")(u) for u in answered["body"]["updates"]), answered
    assert relay.stats["polls_solo"] == solo, relay.stats
    for r in ranks:
        r.close()


def test_the_relay_survives_a_frozen_and_a_restarted_coordinator(tmp_path: Path):
    c = start_coordinator(tmp_path)
    port = int(c.url.rsplit(":", 1)[1])
    try:
        c.create_group("restart", 2, heartbeat_timeout_s=600.0)
        with Relay(c.url, timeout_s=1.0) as relay:
            ranks = [Rank(relay.url, "restart", r) for r in range(2)]
            for r in ranks:
                assert r.send(r.event("join")).status_code == 200
                r.wait_for(own_state(r.rank, "SYNCED"))

            # frozen: no answer in time is a 503, and the channel that did not answer is
            # dropped, so the next batch opens another
            opened = relay.stats["events_channels"]
            c.process.send_signal(signal.SIGSTOP)
            try:
                frozen = ranks[0].send(ranks[0].event("heartbeat"))
            finally:
                c.process.send_signal(signal.SIGCONT)
            assert frozen.status_code == 503, frozen.text
            assert frozen.json()["error"] == "coordinator_unavailable", frozen.text
            thawed = ranks[0].send(ranks[0].event("heartbeat"))
            assert thawed.status_code == 200 and "offset" in thawed.json()["results"][0]
            assert relay.stats["events_channels"] == opened + 1, relay.stats

            # restarted: the lane's channel ends, the lane opens another from where the
            # cache ends, and the workers' polls are still served by the lane
            before = dict(relay.stats)
            stop_coordinator(c)
            c = start_coordinator(tmp_path, port)
            for r in ranks:
                c.client.report_death("restart", r.rank, r.incarnation)
                until_answered(lambda r=r: r.wait_for(own_state(r.rank, "OFFLINE")))
            after = dict(relay.stats)
            assert after["polls_solo"] == before["polls_solo"], (before, after)
            assert after["lane_channels"] > before["lane_channels"], (before, after)
            assert after["lane_channels_max"] == 1, after
            assert ranks[1].send(ranks[1].event("join")).status_code == 200
            for r in ranks:
                r.close()
    finally:
        stop_coordinator(c)


# -- auth ------------------------------------------------------------------------------------


def test_with_auth_on_a_worker_cannot_speak_for_another_rank_through_the_relay(
    secured: Coordinator,
):
    secured.client.create_group("auth", 2, heartbeat_timeout_s=600.0)
    with Relay(secured.url) as relay:
        zero = Rank(relay.url, "auth", 0, agent_token(SECRET, "auth", 0))
        one = Rank(relay.url, "auth", 1, agent_token(SECRET, "auth", 1))
        # rank 0's token on rank 1's join: refused for that event alone
        impostor = Rank(relay.url, "auth", 1, agent_token(SECRET, "auth", 0))
        answers = in_parallel(
            [lambda: zero.send(zero.event("join")), lambda: impostor.send(impostor.event("join"))]
        )
        assert "offset" in answers[0].json()["results"][0], answers[0].text
        assert answers[1].json()["results"][0]["error"] == "forbidden", answers[1].text
        # no token at all, or a forged one, beside rank 0's heartbeats: refused (as a whole
        # request or event by event, depending on where it lands in a batch), and rank 0 is not
        anonymous = Rank(relay.url, "auth", 1)
        forged = Rank(relay.url, "auth", 1, "fpa1.auth.1." + "0" * 64)
        for _ in range(5):
            beat, *refused = in_parallel(
                [
                    lambda: zero.send(zero.event("heartbeat")),
                    lambda: anonymous.send(anonymous.event("join")),
                    lambda: forged.send(forged.event("join")),
                ]
            )
            assert "offset" in beat.json()["results"][0], beat.text
            for answer in refused:
                assert answer.status_code in (200, 401, 403), answer.text
                body = answer.json()
                code = body["results"][0]["error"] if answer.status_code == 200 else body["error"]
                assert code in ("forbidden", "unauthorized"), answer.text

        # every tokened batch went on one channel (the door only lets a batch in), and the
        # untokened ones were each refused at the door of a channel of their own
        assert relay.stats["events_channels"] == 1, relay.stats

        # a merged batch whose first request has a forged token, when no tokened channel is
        # open, is refused at the channel's door: each request is then sent on its own, with
        # its own token at the door, and rank 0's heartbeat still lands
        batch = [
            EventsRequest(with_token([forged.event("join")], forged.token), 100, tokened=True),
            EventsRequest(with_token([zero.event("heartbeat")], zero.token), 100, tokened=True),
        ]
        with Relay(secured.url) as fresh:
            (bad_status, bad), (good_status, good) = fresh.events.send_batch(batch)
            assert fresh.stats["events_upstream"] == 3  # the batch, then each on its own
            assert fresh.stats["events_channels"] == 1  # the forged door was refused
            assert (bad_status, bad["error"]) == (403, "forbidden"), bad
            assert good_status == 200 and "offset" in good["results"][0], good
            # once a tokened channel is open, the forged token is refused for its event alone
            (bad_status, bad), (good_status, good) = fresh.events.send_batch(batch)
            assert fresh.stats["events_upstream"] == 4 and fresh.stats["events_channels"] == 1
            assert bad_status == 200 and bad["results"][0]["error"] == "forbidden", bad
            assert good_status == 200 and "offset" in good["results"][0], good

        # polls: rank 0's token cannot read rank 1's updates, before and after rank 1 is
        # carried by the lane's channel with its own token
        assert impostor.poll(timeout=0.5).status_code == 403
        assert one.send(one.event("join")).status_code == 200
        one.wait_for(own_state(1, "SYNCED"))
        zero.wait_for(own_state(0, "SYNCED"))
        one.follow(timeout=0.5)
        assert relay.stats["lane_channels"] >= 1
        for _ in range(2):
            answer = impostor.poll(timeout=0.5)
            assert answer.status_code == 403 and answer.json()["error"] == "forbidden"
        assert zero.poll(timeout=0.5, rank=1).status_code == 403
        # and the rightful ranks are still served by the lane's one channel
        before = dict(relay.stats)
        secured.client.report_death("auth", 1, one.incarnation)
        one.wait_for(own_state(1, "OFFLINE"))
        assert relay.stats["polls_solo"] == before["polls_solo"], (before, relay.stats)
        assert relay.stats["polls_lane"] > before["polls_lane"], (before, relay.stats)
        for r in (zero, one, impostor, anonymous, forged):
            r.close()


@pytest.mark.slow  # three coordinator starts
def test_a_log_restored_behind_the_workers_resyncs_each_of_them_through_the_relay(tmp_path: Path):
    live, copy = tmp_path / "live", tmp_path / "copy"
    live.mkdir()
    copy.mkdir()
    c = start_coordinator(live)
    port = int(c.url.rsplit(":", 1)[1])
    try:
        c.create_group("restored", 2, heartbeat_timeout_s=600.0)
        with Relay(c.url) as relay:
            ranks = [Rank(relay.url, "restored", r) for r in range(2)]
            for r in ranks:
                assert r.send(r.event("join")).status_code == 200
                r.wait_for(own_state(r.rank, "SYNCED"))
            stop_coordinator(c)
            for f in live.glob("log.db*"):
                shutil.copy(f, copy / f.name)  # the older copy the log is restored from later
            c = start_coordinator(live, port)
            for r in ranks:  # the log moves on past the copy, and the workers with it
                c.client.report_death("restored", r.rank, r.incarnation)
                until_answered(lambda r=r: r.wait_for(own_state(r.rank, "OFFLINE")))
            stop_coordinator(c)
            c = start_coordinator(copy, port)
            for r in ranks:
                held = r.after
                body = until_answered(lambda r=r: r.follow(timeout=2.0))
                assert body["resync"] and body.get("restored"), body
                assert body["next_after"] < held, (body, held)
                again = r.follow(timeout=0.5)  # resumed at the restored log's head
                assert not again.get("restored") and again["next_after"] >= body["next_after"]
            for r in ranks:
                r.close()
    finally:
        stop_coordinator(c)


def until_answered(call: Any, timeout: float = 60.0) -> Any:
    """``call()`` again while the coordinator behind the relay is restarting (a 503)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except AssertionError as exc:
            if "coordinator_unavailable" not in str(exc) or time.monotonic() > deadline:
                raise
