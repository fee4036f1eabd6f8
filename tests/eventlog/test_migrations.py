"""Schema migrations: applied on open, old files upgraded with their data, newer schemas refused."""

from __future__ import annotations

import asyncio
import sqlite3
import struct
from pathlib import Path
from zlib import crc32

import asyncpg
import pytest

from foldplane.eventlog import ChecksumError, LogError, NewRecord, SchemaTooNewError, open_log
from foldplane.eventlog.migrate import code_head, migrate_postgres, migrate_sqlite
from foldplane.eventlog.record import encode_payload
from foldplane.eventlog.target import PostgresTarget, parse_target

OLD_ROWS = [
    # seq, term, ts_ns, kind, grp, rank, payload
    (1, 2, 1_000, "group_created", "train", None, {"world_size": 2}),
    (2, 2, 2_000, "join", "train", 0, {"incarnation": "a"}),
    (3, 3, 3_000, "join", "train", 1, {"incarnation": "b"}),
    (4, 3, 4_000, "tick", None, None, {}),
]

#: The offset of the row ``old_params(damaged=True)`` damages (after its checksum was taken).
DAMAGED = 3


def v1_checksum(
    seq: int, ts: int, term: int, kind: str, grp: str | None, rank: int | None, payload: bytes
) -> int:
    """The checksum as revisions 0001-0003 wrote it: CRC-32 over a packed header (offset, ts,
    term, rank or -1, the lengths of kind and group or 0xFFFF), then kind, group, payload."""
    k, g = kind.encode(), b"" if grp is None else grp.encode()
    head = struct.pack(
        "<qqqqHH",
        seq,
        ts,
        term,
        -1 if rank is None else rank,
        len(k),
        0xFFFF if grp is None else len(g),
    )
    return crc32(head + k + g + payload)


def old_params(damaged: bool = False) -> list[tuple]:
    out = []
    for seq, term, ts, kind, grp, rank, payload in OLD_ROWS:
        data = encode_payload(payload)
        crc = v1_checksum(seq, ts, term, kind, grp, rank, data)
        if damaged and seq == DAMAGED:
            data = data.replace(b'"b"', b'"c"')
        out.append((seq, term, ts, kind, grp, rank, data, crc))
    return out


async def make_revision_1_log(target: str, damaged: bool = False) -> None:
    """A log as the first release wrote it: revision 0001, four records, one consumer."""
    where = parse_target(target)
    if isinstance(where, PostgresTarget):
        await migrate_postgres(where.dsn, where.schema, "test log", create=True, target="0001")
        conn = await asyncpg.connect(where.dsn, server_settings={"search_path": where.schema})
        try:
            await conn.executemany(
                "INSERT INTO log (seq, term, ts_ns, kind, grp, rank, payload, crc) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                old_params(damaged),
            )
            await conn.execute("INSERT INTO consumer_offset VALUES ('fold', 2)")
        finally:
            await conn.close()
        return
    migrate_sqlite(where.path, "test log", target="0001")
    conn = sqlite3.connect(where.path)
    with conn:
        conn.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?, ?)", old_params(damaged))
        conn.execute("INSERT INTO consumer_offset VALUES ('fold', 2)")
    conn.close()


async def revision_1_log_changed(path: Path, sql: str) -> None:
    """A revision-0001 SQLite log at ``path`` with ``sql`` run on it (changing one row)."""
    await make_revision_1_log(str(path))
    conn = sqlite3.connect(path)
    with conn:
        assert conn.execute(sql).rowcount == 1
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
        assert [r.checksum for r in got] == [r.checksum for r in await log.read(group=None)]
        assert log.term == 3  # the head row is seeded with the newest term in the log
        assert await log.head() == 4
        assert await log.get_consumer_offset("fold") == 2
        assert await log.append([NewRecord(kind="tick")]) == [5]
        await log.save_snapshot("fold", 3, b"x")  # a table revision 0002 added
        assert await log.load_snapshot("fold") == (3, b"x")
        assert [r.offset for r in await log.read(group="train", kinds=["join"])] == [2, 3]
    finally:
        await log.close()


async def test_a_record_damaged_before_the_upgrade_is_still_reported(fresh_target: str) -> None:
    """Revision 0004 rewrites every record into a frame with a new checksum; a record whose old
    checksum did not match must not come out of that looking intact."""
    await make_revision_1_log(fresh_target, damaged=True)
    log = await open_log(fresh_target, create=False)
    try:
        assert [r.offset for r in await log.read(0, until=DAMAGED - 1)] == [1, 2]
        with pytest.raises(ChecksumError, match=f"record at offset {DAMAGED} is damaged"):
            await log.read()
        assert [r.offset for r in await log.read(DAMAGED)] == [4]
    finally:
        await log.close()


def test_revision_4_downgrades_to_the_old_columns_and_back(tmp_path: Path) -> None:
    """The frame conversion is reversible: down to 0003 gives the first release's rows back
    (checksums in the old layout, the damaged one still damaged), and up again reads the same."""
    from alembic import command
    from sqlalchemy import create_engine

    from foldplane.eventlog.migrate import alembic_config

    path = tmp_path / "log.db"
    asyncio.run(make_revision_1_log(str(path), damaged=True))
    migrate_sqlite(path, "test log")
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0003")
    finally:
        engine.dispose()
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "SELECT seq, term, ts_ns, kind, grp, rank, payload, crc FROM log ORDER BY seq"
    ).fetchall()
    conn.close()
    expected = old_params(damaged=True)
    assert [r for r in rows if r[0] != DAMAGED] == [r for r in expected if r[0] != DAMAGED]
    (seq, term, ts, kind, grp, rank, data, crc) = rows[DAMAGED - 1]
    assert (seq, term, ts, kind, grp, rank, data) == expected[DAMAGED - 1][:7]
    assert crc != v1_checksum(seq, ts, term, kind, grp, rank, data)  # still reads as damaged
    migrate_sqlite(path, "test log")

    async def read_back() -> None:
        log = await open_log(path, create=False)
        try:
            assert [r.offset for r in await log.read(0, until=2)] == [1, 2]
            with pytest.raises(ChecksumError, match=f"offset {DAMAGED} is damaged"):
                await log.read(2)
            assert [r.payload for r in await log.read(DAMAGED)] == [{}]
        finally:
            await log.close()

    asyncio.run(read_back())


async def test_a_record_whose_columns_cannot_be_converted_stops_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    await revision_1_log_changed(path, "UPDATE log SET ts_ns = 'not a number' WHERE seq = 2")
    with pytest.raises(
        LogError, match="record at offset 2 cannot be converted .* nothing was changed"
    ):
        await open_log(path, create=False)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0001",)
    assert conn.execute("SELECT count(*) FROM log").fetchone() == (4,)
    conn.close()


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
    with pytest.raises(LogError, match=r"notes.txt.*not a foldplane log: not a SQLite database"):
        await open_log(str(path))
    assert path.read_bytes().startswith(b"this is not a SQLite database")


async def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="directory .*nowhere.* does not exist"):
        await open_log(tmp_path / "nowhere" / "log.db")


async def test_a_record_with_undecodable_text_is_carried_over_as_damaged(tmp_path: Path) -> None:
    """A flipped bit can leave a text column that is not UTF-8; the upgrade reads such columns
    as bytes, so it neither fails on it nor makes the record look intact."""
    path = tmp_path / "log.db"
    await revision_1_log_changed(
        path, "UPDATE log SET kind = CAST(X'6A6F69EE' AS TEXT) WHERE seq = 2"
    )
    log = await open_log(path, create=False)
    try:
        assert [r.offset for r in await log.read(0, until=1)] == [1]
        with pytest.raises(ChecksumError, match="record at offset 2 is damaged"):
            await log.read(1)
        assert [r.offset for r in await log.read(2)] == [3, 4]
    finally:
        await log.close()
