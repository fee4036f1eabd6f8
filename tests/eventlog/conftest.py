"""Fixtures for the log's suites: one ``target`` per store, so every conformance test runs twice.

PostgreSQL tests get a fresh schema each (dropped afterwards), so they never see another test's
records and can run beside other suites that use the same database.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import pytest

from foldplane.eventlog import Log, open_log


def schema_url(pg_url: str, schema: str) -> str:
    return f"{pg_url}{'&' if '?' in pg_url else '?'}schema={schema}"


@pytest.fixture
async def pg_schema(pg_url: str) -> AsyncIterator[str]:
    """A fresh, empty schema name; the schema (if created) is dropped after the test."""
    schema = f"eventlog_test_{uuid.uuid4().hex[:12]}"
    yield schema
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> str:
    return request.param


def run_in_own_loop(fn: Callable[[], Awaitable[None]]) -> None:
    """Run a coroutine to completion from sync code that may sit inside a running loop."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, fn()).result()


@pytest.fixture(scope="session")
def pg_session_schema() -> Iterator[str]:
    """One schema migrated once per session; ``target`` empties it before each test.

    Migrating a new schema costs about half a second (Alembic), emptying one a few
    milliseconds; the migration itself is tested on fresh schemas in test_migrations.py.
    """
    from tests.conftest import PG_URL

    schema = f"eventlog_test_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        log = await open_log(schema_url(PG_URL, schema))
        await log.close()

    async def drop() -> None:
        conn = await asyncpg.connect(PG_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    run_in_own_loop(create)
    yield schema
    run_in_own_loop(drop)


async def empty_schema(pg_url: str, schema: str) -> None:
    conn = await asyncpg.connect(pg_url, server_settings={"search_path": schema})
    try:
        await conn.execute(
            "TRUNCATE log, consumer_offset, projection, snapshot, removed_range, kept_snapshot;"
            "UPDATE log_head SET term = 0, next_seq = 1"
        )
    finally:
        await conn.close()


@pytest.fixture
async def target(store: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """Where an empty log lives: a SQLite file in tmp_path, or the emptied session schema."""
    if store == "sqlite":
        return str(tmp_path / "log.db")
    pg_url = request.getfixturevalue("pg_url")
    schema = request.getfixturevalue("pg_session_schema")
    await empty_schema(pg_url, schema)
    return schema_url(pg_url, schema)


@pytest.fixture
def fresh_target(store: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """Where no log exists yet: a new SQLite path, or a PostgreSQL schema never created."""
    if store == "sqlite":
        return str(tmp_path / "fresh.db")
    pg_url = request.getfixturevalue("pg_url")
    return schema_url(pg_url, request.getfixturevalue("pg_schema"))


@pytest.fixture
async def log(target: str) -> AsyncIterator[Log]:
    opened = await open_log(target)
    yield opened
    await opened.close()
