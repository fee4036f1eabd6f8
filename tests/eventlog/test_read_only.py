"""Audits open a log read-only, on both stores: nothing is created, migrated or written, and
a place that holds no foldplane log is refused naming what it holds."""

from __future__ import annotations

import asyncpg
import pytest

from foldplane.eventlog import LogError, NewRecord, open_log
from tests.eventlog.conftest import schema_url

pytestmark = pytest.mark.asyncio


async def test_a_postgres_schema_of_another_application_is_refused_and_left_alone(
    pg_url: str, pg_schema: str
):
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        await conn.execute(f'CREATE TABLE "{pg_schema}".users (id int)')
        with pytest.raises(LogError, match=r"holds no foldplane log \(tables: \[users\]\)"):
            await open_log(schema_url(pg_url, pg_schema), read_only=True)
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1", pg_schema
        )
        assert [t["tablename"] for t in tables] == ["users"]  # no migration ran
    finally:
        await conn.close()


async def test_a_postgres_log_opened_read_only_reads_and_refuses_writes(
    pg_url: str, pg_schema: str
):
    url = schema_url(pg_url, pg_schema)
    log = await open_log(url)
    await log.append([NewRecord(kind="tick", group=None, payload={})])
    await log.close()
    audit = await open_log(url, read_only=True)
    try:
        assert [r.kind for r in await audit.read(0, 10)] == ["tick"]
        with pytest.raises(Exception, match="read-only"):  # PostgreSQL's own refusal
            await audit.append([NewRecord(kind="tick", group=None, payload={})])
    finally:
        await audit.close()
