"""SIGKILL the server under load, again and again, and check what survived.

Simulated agent hosts (``agent.simhost``: the real ``AgentMachine`` per rank) heartbeat, join
again when the coordinator says they are OFFLINE, and ACK; a proposer keeps deactivating and activating a rank
with idempotency keys. At random moments the server is SIGKILLed (no shutdown path runs) and
restarted on the same SQLite file. Then:

- every event that got a success answer is in ``GET /events`` at the offset it was given (a
  heartbeat in the shared ``heartbeat`` record there, which names its rank);
- ``python -m coordinator replay`` finds the stored projections equal to a fold from scratch,
  after every kill (projections are written atomically with their consumer offset);
- every proposal that was answered reaches a terminal outcome (the fold's deadlines resolve the
  ones a crash left pending), and asking again with its key returns the same proposal.

The default run kills the server a few times; the slow mark kills it ``FOLDPLANE_CRASH_KILLS``
times (default 100), so that kills land inside view changes, proposal resolutions and
snapshot writes, not only between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from msgspec import to_builtins

from foldplane.agent.simhost import SimulatedCluster
from foldplane.coordinator.host.replay import replay as replay_log
from foldplane.wire import ranks as rank_sets
from tests.service.conftest import Server, make_server, replay

#: Kills in the default run, and in the slow one.
SHORT_KILLS = 3
FULL_KILLS = int(os.environ.get("FOLDPLANE_CRASH_KILLS", "100"))
CONFIG = {
    "heartbeat_timeout_s": 3.0,
    # Longer than an agent's longest retry backoff (agent.machine.AgentConfig.retry_max_s, 2 s):
    # a restart restarts the ACK deadline of the change in flight, and with a shorter one every
    # rank of the change could miss it while still backing off, and the group end for good
    # (all_ranks_lost), which would end the view changes this test counts.
    "ack_timeout_s": 3.0,
    "admission_timeout_s": 2.0,
    "formation_timeout_s": 120.0,
    "reconcile_window_s": 0.05,
}
TERMINAL = {"applied", "applied_with_dropped_ranks", "rejected"}


class Proposer:
    """Keeps one proposal in flight; remembers every one that got an answer."""

    def __init__(self, client: httpx.AsyncClient, group: str) -> None:
        self.client = client
        self.group = group
        self.answered: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.n = 0

    async def run(self) -> None:
        while True:
            self.n += 1
            body = {
                "group": self.group,
                "op": "deactivate" if self.n % 2 else "activate",
                "ranks": [3],
                "idempotency_key": f"p-{self.n}",
            }
            # A load, paced: a proposal every 50 ms, and while the killed server restarts (in
            # another process, which announces nothing) another try every 100 ms; the task is
            # cancelled at the test's end.
            try:
                r = await self.client.post("/proposals", params={"wait": 0.5}, json=body)
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
                continue
            if r.status_code in (200, 202):
                self.answered[body["idempotency_key"]] = (body, r.json())
            await asyncio.sleep(0.05)


#: Acknowledged events each start of the server must see before it is killed again: the load is
#: counted, not timed (a loaded machine acknowledges fewer events in the same time).
ACKED_PER_START = 30
#: Every this many starts, the start also commits a new view before it is killed: the group's
#: progress under the kills is counted too, not left to how fast the machine is that day.
VIEW_EVERY = 4


async def _kill_loop(
    srv: Server,
    rng: random.Random,
    failures: list[str],
    kills: int,
    acknowledged: Callable[[], int],
    committed: Callable[[], Awaitable[int]],
) -> None:
    """Kill, check the file with the replay the CLI runs (in this process: a hundred starts of
    the CLI would cost more than the kills), restart; the test's end runs the CLI itself.

    Each start serves at least ``ACKED_PER_START`` acknowledged events, and every
    ``VIEW_EVERY``-th start commits a view (``committed``: the current view's version), each
    within 60 s; then it lives on a random 0.2-1.2 s so that the kills land anywhere in the
    cycle. The server is another process, and the agents' acknowledgements and its views are
    counted as they come: each wait looks every 50 ms, bounded by its 60 s. The random life is
    the test's point, not a wait for anything."""
    for i in range(kills):
        floor = acknowledged() + ACKED_PER_START
        version = await committed() if i % VIEW_EVERY == 0 else None
        deadline = asyncio.get_running_loop().time() + 60
        while acknowledged() < floor:
            if asyncio.get_running_loop().time() > deadline:
                failures.append(
                    f"before kill {i + 1}: fewer than {ACKED_PER_START} events acknowledged in 60 s"
                )
                return
            await asyncio.sleep(0.05)
        while version is not None and await committed() <= version:
            if asyncio.get_running_loop().time() > deadline:
                failures.append(f"before kill {i + 1}: no view committed after {version} in 60 s")
                return
            await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0.2, 1.2))
        srv.kill()
        report = await replay_log(str(srv.db))
        if not report.ok:
            failures.append(f"after kill {i + 1}: {report.divergences[:5]}")
        await asyncio.to_thread(srv.start)


async def _current_version(client: httpx.AsyncClient, group: str) -> int:
    """The version of the group's current view (the server may be restarting: asked again, for
    at most 60 s)."""
    async with asyncio.timeout(60):
        while True:
            try:
                r = await client.get("/views/current", params={"group": group})
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
                continue
            if r.status_code == 200:
                return int(r.json()["version"])
            await asyncio.sleep(0.05)


def _acknowledged(sim: SimulatedCluster) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The events the server acknowledged (an offset, no error), as the wire carried them, with
    their answers."""
    sent = [pair for host in sim.hosts for pair in host.sent or []]
    return [(to_builtins(ev), res) for ev, res in sent if "offset" in res and "error" not in res]


@pytest.mark.parametrize(
    "kills",
    [
        pytest.param(SHORT_KILLS, id="short"),
        pytest.param(
            FULL_KILLS,
            id="full",
            marks=[pytest.mark.slow, pytest.mark.timeout(60 + 15 * FULL_KILLS)],
        ),
    ],
)
async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path, kills):
    seed = int(os.environ.get("FOLDPLANE_CRASH_SEED", random.randrange(2**32)))
    print(f"crash seed {seed}")
    rng = random.Random(seed)
    # beats share a record for at most 50 ms: many records, and many beats acknowledged
    args = ["--snapshot-every", "200", "--heartbeat-flush-s", "0.05"]
    srv = make_server(tmp_path, args=args).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            r = await client.post("/groups", json={"group": "crash", "world_size": 4, **CONFIG})
            assert r.status_code == 201
            sim = SimulatedCluster(("127.0.0.1", srv.port), "crash", 4, heartbeat_interval_s=0.1)
            for host in sim.hosts:
                host.sent = []
            await sim.start()
            await sim.wait_until(lambda: sim.all_on(1), 60)
            proposer = Proposer(client, "crash")
            load = asyncio.get_running_loop().create_task(proposer.run())
            failures: list[str] = []
            try:
                await _kill_loop(
                    srv,
                    rng,
                    failures,
                    kills,
                    lambda: len(_acknowledged(sim)),
                    lambda: _current_version(client, "crash"),
                )
            finally:
                load.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await load
            assert not failures, "\n".join(failures)

            # every proposal that was answered reaches a terminal outcome, same id, same body
            for key, (body, first) in proposer.answered.items():
                r = await client.post("/proposals", params={"wait": 30}, json=body)
                assert r.status_code == 200, f"{key}: {r.status_code} {r.text}"
                final = r.json()
                assert final["id"] == first["id"] and final["status"] in TERMINAL, final
                if first["status"] in TERMINAL:
                    assert final == first  # terminal states never change
            await sim.stop()

            # every acknowledged event is in the log at the offset the server gave
            logged: dict[int, dict[str, Any]] = {}
            after = 0
            while True:
                page = (await client.get("/events", params={"after": after, "limit": 1000})).json()
                logged.update({e["offset"]: e for e in page["events"]})
                if not page["events"]:
                    break
                after = page["next_after"]
            assert not sim.stopped, sim.stopped  # no agent gave up
            acknowledged = _acknowledged(sim)
            assert len(acknowledged) > ACKED_PER_START * kills
            kinds = {ev["type"] for ev, _ in acknowledged}
            assert {"join", "links", "ack", "heartbeat"} <= kinds, kinds
            for event, result in acknowledged:
                rec = logged.get(result["offset"])
                assert rec is not None, (
                    f"acknowledged {event} at {result['offset']} is not in the log"
                )
                assert rec["kind"] == event["type"], (event, rec)
                if event["type"] == "heartbeat":  # a shared record naming every rank in it
                    assert rec["rank"] is None, rec
                    assert event["rank"] in rank_sets.decode(rec["payload"]["ranks"], 4), rec
                else:
                    assert (rec["rank"], rec["payload"]["incarnation"]) == (
                        event["rank"],
                        event["incarnation"],
                    ), (event, rec)
            for _, answer in proposer.answered.values():
                assert logged[answer["id"]]["kind"] == "proposal"
            assert len(proposer.answered) >= kills
            views = (await client.get("/views/history", params={"group": "crash"})).json()
            assert len(views["views"]) > 1 + kills // 4, "too few view changes under the kills"
    finally:
        srv.stop()
    done = replay(srv.db)
    assert done.returncode == 0, done.stdout
