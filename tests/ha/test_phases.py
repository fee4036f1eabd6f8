"""A leader frozen at each step of its work, and woken after its lease, writes nothing.

Real ``serve`` processes on the real PostgreSQL and real signals; where the process freezes is
chosen with a stop point (``eventlog.failpoints``): armed by a file, the leader stops itself
(SIGSTOP) the next time it reaches the step, with the step's statement not yet sent:

- ``append``: a batch of records;
- ``projections``: projection rows with the consumer offset;
- ``snapshot``: the fold's snapshot;
- ``renew``: its lease renewal;
- ``claim``: a standby that just won the lease, before it takes the log's term.

In each, the standby takes over after the lease ran out; then the new leader is frozen too (it
holds a long lease, so nobody else may lead meanwhile) and every table of the schema is read;
the old one is woken (SIGCONT), carries on from its step, and steps down; and every table reads
exactly as before: not a record, a projection row, an offset, a snapshot, a term or a lease
written by a coordinator that woke after its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ha.cluster import Node, fetch, replay, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(180)]

#: The leader elected after the frozen one holds its lease this long, so that it cannot lose it
#: while it is frozen in turn (the old one, awake, could then lead again, legitimately).
LONG_LEASE = ("--lease-s", "60")
#: Snapshots every few records, so that creating a group or two reaches one.
SNAPSHOTS = ("--snapshot-every", "3")
WAIT_S = 30.0

#: Every table a coordinator writes, each row reduced to what identifies its content.
TABLES = {
    "log": "SELECT seq, term, kind, grp, md5(frame) FROM log ORDER BY seq",
    "log_head": "SELECT term, next_seq FROM log_head",
    "projection": "SELECT kind, grp, seq, md5(doc) FROM projection ORDER BY kind, grp, seq",
    "consumer_offset": "SELECT consumer, seq FROM consumer_offset ORDER BY consumer",
    "snapshot": "SELECT name, seq, md5(data) FROM snapshot ORDER BY name",
    "leader_lease": "SELECT generation, holder, term, holder_pid, expires_at FROM leader_lease",
}


def _tables(schema: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(row.values()) for row in asyncio.run(fetch(schema, sql))]
        for name, sql in TABLES.items()
    }


def _stop_env(point: str, arm: Path) -> dict[str, str]:
    return {"FOLDPLANE_STOP_AT": point, "FOLDPLANE_STOP_ARM": str(arm)}


def _create_in_background(node: Node, group: str) -> threading.Thread:
    """``POST /groups`` to ``node`` alone, from a thread: a frozen node answers it late."""

    def send() -> None:
        # refused or cut off: what it wrote is what the tables say
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(node.url + "/groups", json={"group": group, "world_size": 2}, timeout=90)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _woken_writes_nothing(schema: str, woken: Node, new_leader: Node) -> None:
    """Freeze the new leader, read every table, wake the old one, let it step down, and read
    them again: unchanged."""
    new_leader.freeze()
    before = _tables(schema)
    woken.resume()
    wait_for(lambda: woken.role() == "standby", WAIT_S, "the woken coordinator to follow")
    after = _tables(schema)
    for name in TABLES:
        assert after[name] == before[name], f"the woken coordinator wrote to {name}"
    new_leader.resume()
    checked = replay(schema)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("point", ["append", "projections", "snapshot", "renew"])
def test_a_leader_frozen_at_a_step_writes_nothing_once_woken_after_its_lease(
    point: str, nodes: Callable[..., Node], schema: str, tmp_path: Path
) -> None:
    arm = tmp_path / "arm"
    a = nodes(*SNAPSHOTS, env=_stop_env(point, arm)).start()
    a.wait_ready()
    a.wait_role("leader")
    b = nodes(*SNAPSHOTS, *LONG_LEASE).start()
    b.wait_ready()
    wait_for(lambda: b.role() == "standby", WAIT_S, "b to follow")
    httpx.post(a.url + "/groups", json={"group": "before", "world_size": 2}, timeout=10)

    arm.touch()
    if point != "renew":  # the others need something to write
        for i in range(4):
            _create_in_background(a, f"during-{i}")
            if a.stopped():
                break
    wait_for(a.stopped, WAIT_S, f"a to stop itself at {point}")
    assert not arm.exists()
    wait_for(lambda: b.role() == "leader", WAIT_S, "b to take over")
    _woken_writes_nothing(schema, a, b)


def test_a_standby_frozen_after_winning_the_lease_takes_no_term_once_woken(
    nodes: Callable[..., Node], schema: str, tmp_path: Path
) -> None:
    arm = tmp_path / "arm"
    a = nodes().start()
    a.wait_ready()
    a.wait_role("leader")
    b = nodes(env=_stop_env("claim", arm)).start()
    b.wait_ready()
    httpx.post(a.url + "/groups", json={"group": "before", "world_size": 2}, timeout=10)

    arm.touch()
    a.freeze()  # its lease runs out; b wins it and stops before it takes the term
    try:
        wait_for(b.stopped, WAIT_S, "b to stop itself between the lease and the term")
        c = nodes(*LONG_LEASE).start()  # b's lease runs out in turn; c wins it
        wait_for(lambda: c.role() == "leader", WAIT_S, "c to take over from the frozen claimant")
        _woken_writes_nothing(schema, b, c)
    finally:
        a.resume()
