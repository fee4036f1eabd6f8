"""Failover: from the leader's death to the first acknowledged write and view change after it.

Two real ``python -m coordinator serve`` processes share a PostgreSQL schema with the default
lease settings (lease 1 s, standby poll 0.1 s). One simulated agent host (``agent.simhost``:
the real ``AgentMachine`` for each of the 4 ranks, following ``503 not_leader`` over both
addresses as the real client does; its event loop in a thread of its own) keeps a steady load
of heartbeats and ACKs every view change. In each trial the leader is

- **crashed** (SIGKILL): its database session ends, so the standby may claim at its next poll;
- **frozen** (SIGSTOP): its session stays open, so the standby waits for the lease to run out;
  the agent host's channel to it falls silent (a leader pings every channel each quarter
  lease), so the host drops it after a lease and opens its next one on the standby first.

Measured from the signal: the first heartbeat the new leader acknowledges, and the first
committed view change (a proposal sent at the signal, retried until a leader takes it, and
committed once every agent ACKed it on the new leader). The baseline, measured in the same run,
is what a single coordinator gives: SIGKILL it and start a new process on the same log at once
(as a supervisor would), with the same agents and the same proposal.

``FOLDPLANE_BENCH_PG`` overrides the PostgreSQL URL; each scenario uses its own schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg

from ..agent.client import CoordinatorClient, CoordinatorUnavailable
from .harness import Result, lower_is_better_ratio, median, percentile
from .kit.service import Service
from .kit.simulated import TimedCluster

BENCH = "failover"
PG_URL = os.environ.get("FOLDPLANE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
WORLD = 4
#: Long enough that a cold restart does not time the ranks out (the baseline stays fair).
GROUP = {"heartbeat_timeout_s": 30.0, "ack_timeout_s": 30.0, "admission_timeout_s": 30.0}
HEARTBEAT_S = 0.02
RETRY_S = 0.01
#: Beats share a record for at most this long, so acknowledged writes stay frequent.
FLUSH = ("--heartbeat-flush-s", "0.02")
BASELINE = "cold restart of the only coordinator"


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
    return value


def _coordinator(url: str) -> Service:
    """One ``serve`` process on the shared schema; restarting it keeps its port, so clients'
    address lists hold."""
    return Service(*FLUSH, db=url, name="failover")


T = TypeVar("T")


class Agents:
    """Every rank of one group, in a simulated host whose event loop runs in a thread of its
    own: when each write was acknowledged and when each view was first installed."""

    def __init__(self, addresses: list[str], group: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.committed: dict[int, float] = {}
        where = [(u.hostname or "127.0.0.1", u.port or 80) for u in map(urlsplit, addresses)]
        self.cluster: TimedCluster = self._run(self._start(where, group))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    async def _start(self, where: list[tuple[str, int]], group: str) -> TimedCluster:
        cluster = TimedCluster(where, group, WORLD, heartbeat_interval_s=HEARTBEAT_S)
        await cluster.start()
        self._recorder = self.loop.create_task(self._record(cluster))
        return cluster

    async def _record(self, cluster: TimedCluster) -> None:
        def note() -> bool:  # called on every view installed
            for rank in range(WORLD):
                view = cluster.view(rank)
                if view is not None:
                    self.committed.setdefault(view.version, time.monotonic())
            return False

        await cluster.wait_until(note, timeout=24 * 3600)

    def stop(self) -> None:
        try:
            self._recorder.cancel()
            self._run(self.cluster.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def first_ack_after(self, t: float, timeout: float = 60.0) -> float:
        def find() -> float | None:
            after = [
                h.acked_at[i]
                for h in self.cluster.hosts
                if (i := bisect_right(h.acked_at, t)) < len(h.acked_at)
            ]
            return min(after, default=None)

        return _wait(find, timeout, "a write acknowledged after the failure")

    def version_seen(self, version: int, timeout: float = 60.0) -> float:
        return _wait(lambda: self.committed.get(version), timeout, f"view {version} committed")


def _propose(addresses: list[str], op: str, key: str) -> None:
    """Send one proposal, retrying while no coordinator takes it (as an operator would)."""
    client = CoordinatorClient(addresses, timeout_s=0.5)
    try:
        while True:
            try:
                client.propose("bench", op, [WORLD - 1], idempotency_key=key, wait_s=0.0)
                return
            except CoordinatorUnavailable:
                time.sleep(RETRY_S)
    finally:
        client.close()


def _trial(
    fail: Callable[[], None], agents: Agents, addresses: list[str], version: int
) -> tuple[float, float]:
    """Fail the leader; return seconds to the first acked write and to view ``version + 1``."""
    op = "deactivate" if version % 2 == 1 else "activate"
    t0 = time.monotonic()
    fail()
    proposer = threading.Thread(target=_propose, args=(addresses, op, uuid.uuid4().hex))
    proposer.start()
    write = agents.first_ack_after(t0) - t0
    view = agents.version_seen(version + 1) - t0
    proposer.join()
    return write, view


async def _drop(schemas: list[str]) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _pair_trials(url: str, crash: int, freeze: int) -> dict[str, list[float]]:
    a, b = _coordinator(url).start(wait=False), _coordinator(url)
    a.wait_role("leader")
    b.start(wait=False).wait_role("standby")
    addresses = [a.url, b.url]
    out: dict[str, list[float]] = {k: [] for k in ("crash_w", "crash_v", "freeze_w", "freeze_v")}
    agents = None
    try:
        CoordinatorClient(addresses).create_group("bench", WORLD, **GROUP)
        agents = Agents(addresses, "bench")
        agents.version_seen(1)
        version, leader, standby = 1, a, b
        for kind in ["crash"] * crash + ["freeze"] * freeze:
            time.sleep(0.5)  # steady load before the failure
            sig = signal.SIGKILL if kind == "crash" else signal.SIGSTOP
            w, v = _trial(lambda s=sig, n=leader: n.signal(s), agents, addresses, version)
            out[f"{kind}_w"].append(w)
            out[f"{kind}_v"].append(v)
            version += 1
            standby.wait_role("leader")
            if kind == "crash":
                leader.start(wait=False)
            else:
                leader.signal(signal.SIGCONT)  # it steps down and follows
            leader.wait_role("standby")
            leader, standby = standby, leader
    finally:
        if agents is not None:
            agents.stop()
        a.close()
        b.close()
    return out


def _baseline_trials(url: str, n: int) -> dict[str, list[float]]:
    only = _coordinator(url).start(wait=False)
    only.wait_role("leader")
    out: dict[str, list[float]] = {"w": [], "v": []}
    agents = None
    try:
        CoordinatorClient([only.url]).create_group("bench", WORLD, **GROUP)
        agents = Agents([only.url], "bench")
        agents.version_seen(1)
        for version in range(1, n + 1):
            time.sleep(0.5)

            def restart() -> None:
                only.signal(signal.SIGKILL)
                only.start(wait=False)

            w, v = _trial(restart, agents, [only.url], version)
            out["w"].append(w)
            out["v"].append(v)
            only.wait_role("leader")
    finally:
        if agents is not None:
            agents.stop()
        only.close()
    return out


def run(quick: bool) -> list[Result]:
    crash, freeze, cold = (3, 3, 3) if quick else (10, 5, 5)
    schemas = [f"bench_ha_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    urls = [f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={s}" for s in schemas]
    try:
        pair = _pair_trials(urls[0], crash, freeze)
        base = _baseline_trials(urls[1], cold)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(_drop(schemas))

    def result(metric: str, xs: list[float], baseline: list[float] | None, target: str) -> Result:
        ours = median(xs)
        theirs = median(baseline) if baseline else None
        return Result(
            bench=BENCH,
            metric=metric,
            unit="s",
            median=ours,
            p99=percentile(xs, 99),
            baseline=BASELINE if baseline else None,
            baseline_median=theirs,
            ratio=lower_is_better_ratio(ours, theirs) if theirs else None,
            target=target,
            extra={"trials": len(xs), "lease_s": 1.0, "poll_s": 0.1},
        )

    return [
        result("SIGKILL -> first acked write", pair["crash_w"], base["w"], "median <= 2 s"),
        result("SIGKILL -> first committed view", pair["crash_v"], base["v"], "median <= 2 s"),
        result("SIGSTOP -> first acked write", pair["freeze_w"], None, "about lease + poll"),
        result("SIGSTOP -> first committed view", pair["freeze_v"], None, "median <= 2 s"),
    ]
