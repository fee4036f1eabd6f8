"""Schema migrations: applied on open, old files upgraded with their data, newer schemas refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from eventlog import LogError, NewRecord, SchemaTooNewError, open_log
from eventlog.migrate import code_head, migrate_postgres, migrate_sqlite
from eventlog.record import checksum, encode_payload
from eventlog.target import PostgresTarget, parse_target

OLD_ROWS = [
    # seq, term, ts_ns, kind, grp, rank, payload
    (1, 2, 1_000, "group_created", "train", None, {"world_size": 2}),
    (2, 2, 2_000, "join", "train", 0, {"incarnation": "a"}),
    (3, 3, 3_000, "join", "train", 1, {"incarnation": "b"}),
]


def old_params() -> list[tuple]:
    out = []
    for seq, term, ts, kind, grp, rank, payload in OLD_ROWS:
        data = encode_payload(payload)
        out.append(
            (seq, term, ts, kind, grp, rank, data, checksum(seq, ts, term, kind, grp, rank, data))
        )
    return out


async def make_revision_1_log(target: str) -> None:
    """A log as the first release wrote it: revision 0001, three records, one consumer."""
    where = parse_target(target)
    if isinstance(where, PostgresTarget):
        await migrate_postgres(where.dsn, where.schema, "test log", create=True, target="0001")
        conn = await asyncpg.connect(where.dsn, server_settings={"search_path": where.schema})
        try:
            await conn.executemany(
                "INSERT INTO log (seq, term, ts_ns, kind, grp, rank, payload, crc) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                old_params(),
            )
            await conn.execute("INSERT INTO consumer_offset VALUES ('fold', 2)")
        finally:
            await conn.close()
        return
    migrate_sqlite(where.path, "test log", target="0001")
    conn = sqlite3.connect(where.path)
    with conn:
        conn.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?, ?)", old_params())
        conn.execute("INSERT INTO consumer_offset VALUES ('fold', 2)")
    conn.close()


async def set_revision(target: str, revision: str) -> None:
    where = parse_target(target)
    if isinstance(where, PostgresTarget):
        conn = await asyncpg.connect(where.dsn, server_settings={"search_path": where.schema})
        try:
            await conn.execute("UPDATE alembic_version SET version_num = $1", revision)
        finally:
            await conn.close()
        return
    conn = sqlite3.connect(where.path)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    conn.close()


async def test_revision_1_log_is_upgraded_with_its_data_intact(fresh_target: str) -> None:
    target = fresh_target
    await make_revision_1_log(target)
    log = await open_log(target, create=False)
    try:
        got = await log.read()
        assert [(r.offset, r.term, r.ts, r.kind, r.group, r.rank, r.payload) for r in got] == [
            tuple(row) for row in OLD_ROWS
        ]
        assert log.term == 3  # the head row is seeded with the newest term in the log
        assert await log.head() == 3
        assert await log.get_consumer_offset("fold") == 2
        assert await log.append([NewRecord(kind="tick")]) == [4]
        await log.save_snapshot("fold", 3, b"x")  # a table revision 0002 added
        assert await log.load_snapshot("fold") == (3, b"x")
    finally:
        await log.close()


async def test_a_newer_schema_is_refused_and_left_alone(fresh_target: str) -> None:
    target = fresh_target
    log = await open_log(target)
    await log.append([NewRecord(kind="tick")])
    await log.close()
    await set_revision(target, "9999_from_the_future")
    with pytest.raises(SchemaTooNewError) as caught:
        await open_log(target)
    message = str(caught.value)
    assert "schema revision '9999_from_the_future'" in message
    assert f"its newest migration is {code_head()!r}" in message
    assert caught.value.db_revision == "9999_from_the_future"
    await set_revision(target, code_head())  # nothing else was touched
    log = await open_log(target)
    try:
        assert [r.kind for r in await log.read()] == ["tick"]
    finally:
        await log.close()


async def test_two_openers_of_a_new_log_create_it_once(fresh_target: str) -> None:
    target = fresh_target
    import asyncio

    logs = await asyncio.gather(open_log(target), open_log(target), open_log(target))
    try:
        offsets = await asyncio.gather(*(log.append([NewRecord(kind="tick")]) for log in logs))
        assert sorted(o for r in offsets for o in r) == [1, 2, 3]
    finally:
        for log in logs:
            await log.close()


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a SQLite database, just some text " * 100)
    with pytest.raises(LogError, match=r"notes.txt.*file is not a database"):
        await open_log(str(path))
    assert path.read_bytes().startswith(b"this is not a SQLite database")


async def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="directory .*nowhere.* does not exist"):
        await open_log(tmp_path / "nowhere" / "log.db")
