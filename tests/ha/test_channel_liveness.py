"""A frozen leader's host channels: silent past the lease, aborted, and moved to the new leader.

Real ``serve`` processes on the real PostgreSQL, the agents' own channel client
(``agent.channel.ChannelLink``), real signals:

- a leader names its lease in the channel's ``101`` and, idle, still writes (pings) several
  times per lease, so a channel that hears nothing for a lease is not a quiet leader;
- SIGSTOP the leader: its channel is aborted as silent within about a lease (it stays open
  for ever otherwise: the frozen process's kernel keeps the connection), its address becomes a
  suspect, and the openings that follow never go back to it, even while the standby still
  names it as the leader, until the standby leads and takes the channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from foldplane.agent.channel import ChannelLink, ChannelRefused, HostChannel
from foldplane.agent.client import CoordinatorClient
from tests.ha.cluster import LEASE_S, Node, retrying, wait_for
from tests.ha.test_failover import GROUP, _leader_and_standby

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(120)]

#: How long an opening may wait on one address: a link that went back to the frozen leader
#: would wait this long there and fail the test with a TimeoutError.
OPEN_TIMEOUT_S = 20.0


def _where(node: Node) -> tuple[str, int]:
    return ("127.0.0.1", node.port)


def test_an_idle_leaders_channel_names_its_lease_and_is_never_silent(
    nodes: Callable[..., Node],
) -> None:
    a = nodes().start()
    a.wait_ready()
    a.wait_role("leader")
    retrying(lambda: CoordinatorClient([a.url]).create_group("idle", 2, **GROUP))

    async def main() -> None:
        link = ChannelLink([_where(a)], timeout_s=OPEN_TIMEOUT_S)
        channel = await link.open(group="idle", ranks=[0, 1])
        try:
            assert channel.liveness_s == LEASE_S
            received = channel.bytes_received  # the first push (the group's state)
            # Three leases of nothing to say: the leader pings, and the channel lives on.
            await asyncio.sleep(3 * LEASE_S)
            assert channel.closed is None, channel.closed
            assert channel.bytes_received >= received + 4 * 2  # >= a ping (2 bytes) per lease
        finally:
            channel.close()

    asyncio.run(main())


def test_a_frozen_leaders_channel_is_aborted_and_reopened_on_the_new_leader(
    nodes: Callable[..., Node],
) -> None:
    a, b = _leader_and_standby(nodes)
    retrying(lambda: CoordinatorClient([a.url, b.url]).create_group("moved", 2, **GROUP))

    async def main() -> HostChannel:
        link = ChannelLink([_where(a), _where(b)], timeout_s=OPEN_TIMEOUT_S)
        channel = await link.open(group="moved", ranks=[0, 1])
        assert channel.address == _where(a)
        a.freeze()
        frozen_at = time.monotonic()
        async with asyncio.timeout(10 * LEASE_S):
            await channel.ended
        assert channel.silent, channel.closed
        assert "sent nothing for" in str(channel.closed) and "lease" in str(channel.closed)
        assert time.monotonic() - frozen_at < 10 * LEASE_S
        link.closed(channel)
        assert link.suspect(_where(a))
        # The standby names the frozen leader until the lease runs out: the link refuses to go
        # there (a TimeoutError would say it did) and the retries find the standby leading.
        # The standby takes over through PostgreSQL, in another process, and announces it to
        # nobody: the link is opened again every 50 ms, for at most 30 s.
        deadline = time.monotonic() + 30
        while True:
            try:
                moved = await link.open(group="moved", ranks=[0, 1])
                break
            except ChannelRefused as exc:
                assert exc.status == 503, exc
                assert time.monotonic() < deadline, "the standby never took the channel"
                await asyncio.sleep(0.05)
        assert moved.address == _where(b)
        return moved

    try:
        moved = asyncio.run(main())
        assert moved.closed is None or moved.silent is False
    finally:
        a.resume()
    wait_for(lambda: a.role() == "standby", 30, "the old leader to step down")
