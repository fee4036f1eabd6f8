"""Fixtures for the log's suites: one ``target`` per store, so every conformance test runs twice.

PostgreSQL tests get a fresh schema each (dropped afterwards), so they never see another test's
records and can run beside other suites that use the same database.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from eventlog import Log, open_log


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


@pytest.fixture
def target(store: str, request: pytest.FixtureRequest, tmp_path) -> str:
    """Where a fresh log lives: a SQLite file in tmp_path, or a new PostgreSQL schema."""
    if store == "sqlite":
        return str(tmp_path / "log.db")
    pg_url = request.getfixturevalue("pg_url")
    return schema_url(pg_url, request.getfixturevalue("pg_schema"))


@pytest.fixture
async def log(target: str) -> AsyncIterator[Log]:
    opened = await open_log(target)
    yield opened
    await opened.close()
