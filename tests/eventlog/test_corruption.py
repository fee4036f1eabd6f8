"""Damage is reported with the record's offset; nothing is skipped silently."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from eventlog import ChecksumError, NewRecord, open_log
from eventlog.target import parse_target


def records() -> list[NewRecord]:
    return [
        NewRecord(
            kind="exit" if i == 5 else "heartbeat",
            group="train",
            rank=i % 4,
            payload={"marker": f"needle-{i:04d}"},
        )
        for i in range(1, 11)
    ]


def flip_first(path: Path, needle: bytes, at: int) -> None:
    """Flip one bit of the byte ``at`` positions into the only occurrence of ``needle``."""
    data = bytearray(path.read_bytes())
    assert data.count(needle) == 1, f"{needle!r} occurs {data.count(needle)} times in the file"
    pos = data.index(needle) + at
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("needle", "at"),
    [(b"needle-0005", 8), (b"exit", 1)],
    ids=["payload-byte", "kind-byte"],
)
async def test_a_flipped_byte_in_the_file_names_the_offset(
    tmp_path: Path, needle: bytes, at: int
) -> None:
    path = tmp_path / "log.db"
    log = await open_log(path)
    assert await log.append(records()) == list(range(1, 11))
    await log.close()  # the last connection checkpoints the WAL into the main file
    assert not Path(f"{path}-wal").exists()
    flip_first(path, needle, at)

    log = await open_log(path)
    try:
        assert [r.offset for r in await log.read(0, until=4)] == [1, 2, 3, 4]
        with pytest.raises(ChecksumError, match="record at offset 5 is damaged") as caught:
            await log.read()
        assert caught.value.offset == 5
        with pytest.raises(ChecksumError, match="offset 5"):
            async for _ in log.tail(2):
                pass
        assert [r.offset for r in await log.read(5)] == [6, 7, 8, 9, 10]
    finally:
        await log.close()


async def test_damage_in_a_checked_column_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = await open_log(path)
    await log.append(records())
    await log.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE log SET rank = rank + 1 WHERE seq = 7")
    conn.close()
    log = await open_log(path)
    try:
        with pytest.raises(ChecksumError, match="record at offset 7 is damaged: stored checksum"):
            await log.read(6)
    finally:
        await log.close()


@pytest.mark.postgres
async def test_damaged_row_on_postgres_names_the_offset(pg_url: str, pg_schema: str) -> None:
    from tests.eventlog.conftest import schema_url

    target = schema_url(pg_url, pg_schema)
    log = await open_log(target)
    try:
        await log.append(records())
        where = parse_target(target)
        conn = await asyncpg.connect(where.dsn, server_settings={"search_path": pg_schema})
        try:
            await conn.execute(
                "UPDATE log SET payload = overlay(payload placing '\\x58'::bytea from 5) WHERE seq = 3"
            )
        finally:
            await conn.close()
        with pytest.raises(ChecksumError, match="record at offset 3 is damaged") as caught:
            await log.read()
        assert caught.value.offset == 3
    finally:
        await log.close()
