"""Damage is reported with the record's offset; nothing is skipped silently."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from foldplane.eventlog import ChecksumError, NewRecord, open_log
from foldplane.eventlog.target import parse_target


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
    [(b"needle-0005", 8), (b'"exit"', 2)],
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


async def written_then_changed(path: Path, sql: str) -> None:
    """A log of ``records()`` at ``path``, closed, then ``sql`` run on the file behind its back
    (it must change exactly one row)."""
    log = await open_log(path)
    await log.append(records())
    await log.close()
    conn = sqlite3.connect(path)
    with conn:
        assert conn.execute(sql).rowcount == 1
    conn.close()


async def test_a_changed_field_inside_a_frame_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    await written_then_changed(
        path,
        "UPDATE log SET frame = CAST(replace(CAST(frame AS TEXT), '\"train\",3,', "
        "'\"train\",2,') AS BLOB) WHERE seq = 7 AND instr(frame, '\"train\",3,') > 0",
    )
    log = await open_log(path)
    try:
        with pytest.raises(ChecksumError, match="record at offset 7 is damaged: stored checksum"):
            await log.read(6)
    finally:
        await log.close()


async def test_a_filter_column_that_disagrees_with_its_frame_is_reported(tmp_path: Path) -> None:
    """``kind`` and ``grp`` are copies of the frame's fields kept for filtering: a filtered read
    checks each record it returns against the filter."""
    path = tmp_path / "log.db"
    await written_then_changed(path, "UPDATE log SET grp = 'other', kind = 'exit' WHERE seq = 7")
    log = await open_log(path)
    try:
        assert [r.offset for r in await log.read(group="train")] == [1, 2, 3, 4, 5, 6, 8, 9, 10]
        with pytest.raises(
            ChecksumError, match="offset 7 is damaged: its columns place it in group 'other'"
        ):
            await log.read(group="other")
        with pytest.raises(ChecksumError, match="offset 7 is damaged: .* kind 'heartbeat'"):
            await log.read(kinds=["exit"])
        assert (await log.read(6, 1))[0].group == "train"  # the record itself is intact
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
                "UPDATE log SET frame = overlay(frame placing '\\x58'::bytea from 60) WHERE seq = 3"
            )
        finally:
            await conn.close()
        with pytest.raises(ChecksumError, match="record at offset 3 is damaged") as caught:
            await log.read()
        assert caught.value.offset == 3
    finally:
        await log.close()
