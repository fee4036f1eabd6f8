"""The lease row on the real PostgreSQL, in-process: who may claim it, when, and what is fenced."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import asyncpg
import pytest

from foldplane.coordinator.host.leadership import Lease, LeaseError, LeaseSettings
from foldplane.eventlog import open_log
from foldplane.eventlog.target import PostgresTarget, parse_target
from tests.conftest import PG_URL
from tests.ha.cluster import drop_schema, new_schema, schema_url

pytestmark = pytest.mark.postgres

LONG = LeaseSettings(lease_s=60.0, poll_s=0.05)


@pytest.fixture
async def target() -> AsyncIterator[PostgresTarget]:
    """A schema migrated to the code's head (so it has its leader_lease row)."""
    schema = new_schema()
    log = await open_log(schema_url(schema))
    await log.close()
    where = parse_target(schema_url(schema))
    assert isinstance(where, PostgresTarget)
    yield where
    await drop_schema(schema)


def lease(target: PostgresTarget, name: str, settings: LeaseSettings = LONG) -> Lease:
    return Lease(target, f"{name}#test", f"http://{name}:8470", settings)


async def query(target: PostgresTarget, sql: str) -> object:
    conn = await asyncpg.connect(target.dsn, server_settings={"search_path": target.schema or ""})
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_simultaneous_claims_have_exactly_one_winner(target: PostgresTarget) -> None:
    claimants = [lease(target, f"c{i}") for i in range(6)]
    try:
        for round_ in range(3):
            states = await asyncio.gather(*(c.try_claim() for c in claimants))
            winners = [(c, s) for c, s in zip(claimants, states, strict=True) if s.won is not None]
            assert len(winners) == 1, f"round {round_}: {states}"
            winner, state = winners[0]
            assert state.won == round_ + 1  # one generation per successful claim
            again = await asyncio.gather(*(c.try_claim() for c in claimants))
            assert all(s.won is None and s.leader == winner.address for s in again)
            await winner.release(state.won)
    finally:
        for c in claimants:
            await c.close()


async def test_a_live_lease_is_kept_and_a_lost_generation_cannot_renew(
    target: PostgresTarget,
) -> None:
    a, b = lease(target, "a"), lease(target, "b")
    try:
        first = await a.try_claim()
        assert first.won == 1
        seen = await b.try_claim()
        assert seen.won is None and seen.leader == a.address and seen.live
        assert await a.renew(1, term=7)
        assert (await b.try_claim()).term == 7  # the holder's term, for whoever asks
        await a.release(1)
        second = await b.try_claim()
        assert second.won == 2
        assert not await a.renew(1), "a deposed holder renewed the lease of another generation"
        assert (await a.try_claim()).leader == b.address
    finally:
        await a.close()
        await b.close()


async def test_a_crashed_holder_is_replaced_before_its_lease_runs_out(
    target: PostgresTarget,
) -> None:
    a, b = lease(target, "a"), lease(target, "b")
    try:
        assert (await a.try_claim()).won == 1
        assert (await b.try_claim()).won is None
        expires = await query(target, "SELECT expires_at FROM leader_lease")
        # The holder's process dies: its connection closes and its backend exits.
        conn = a._conn
        assert conn is not None
        conn.terminate()
        # PostgreSQL ends the dead holder's backend in its own time and tells no other
        # session: ``b`` claims again every 20 ms, for at most 10 s.
        deadline = asyncio.get_running_loop().time() + 10
        while (state := await b.try_claim()).won is None:
            assert asyncio.get_running_loop().time() < deadline, "the dead holder kept the lease"
            await asyncio.sleep(0.02)
        assert state.won == 2
        assert expires > await query(target, "SELECT now()")  # a's lease had not run out
    finally:
        await a.close()
        await b.close()


async def test_a_frozen_holder_is_replaced_only_once_its_lease_ran_out(
    target: PostgresTarget,
) -> None:
    short = LeaseSettings(lease_s=0.5, poll_s=0.05)
    a, b = lease(target, "a", short), lease(target, "b", short)
    try:
        assert (await a.try_claim()).won == 1
        # ``a`` keeps its session (alive, as a SIGSTOPped process would) but stops renewing.
        # The lease runs out on PostgreSQL's clock, which announces nothing: ``b`` claims
        # every 50 ms, for at most 10 s (the lease is 0.5 s).
        refused = 0
        deadline = asyncio.get_running_loop().time() + 10
        while (state := await b.try_claim()).won is None:
            assert state.leader == a.address  # while it is live, nobody else may claim
            assert asyncio.get_running_loop().time() < deadline, "the lease never ran out"
            refused += 1
            await asyncio.sleep(0.05)
        assert refused > 0 and state.won == 2
        assert not await a.renew(1)
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_s": 0}, "lease_s must be a positive number of seconds, got 0"),
        ({"lease_s": math.nan}, "lease_s must be a positive number of seconds, got nan"),
        ({"poll_s": -1.0}, "poll_s must be a positive number of seconds, got -1.0"),
        ({"lease_s": 1.0, "poll_s": 1.0}, "poll_s (1.0 s) must be shorter than lease_s (1.0 s)"),
    ],
)
def test_settings_refuse_what_cannot_work(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        LeaseSettings(**kwargs)
    assert message in str(caught.value)


def test_default_settings_renew_four_times_per_lease() -> None:
    settings = LeaseSettings()
    assert (settings.lease_s, settings.poll_s, settings.renew_s) == (1.0, 0.1, 0.25)


async def test_an_unreachable_database_is_a_lease_error_naming_it() -> None:
    where = PostgresTarget("postgresql://postgres@127.0.0.1:1/test", None)
    unreachable = lease(where, "a")
    with pytest.raises(LeaseError) as caught:
        await unreachable.try_claim()
    assert "cannot connect to PostgreSQL log 127.0.0.1:1/test" in str(caught.value)


async def test_a_schema_without_the_lease_table_is_named() -> None:
    schema = new_schema()
    conn = await asyncpg.connect(PG_URL)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.close()
    where = PostgresTarget(parse_target(schema_url(schema)).dsn, schema)  # type: ignore[union-attr]
    bare = lease(where, "a")
    try:
        with pytest.raises(LeaseError) as caught:
            await bare.try_claim()
        assert 'relation "leader_lease" does not exist' in str(caught.value)
    finally:
        await bare.close()
        await drop_schema(schema)
