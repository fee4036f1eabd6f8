"""The SQLite log checkpoints its WAL by the WAL file's own size: after many small commits
(each writes whole pages, whatever its payload) the main file alone holds nearly all of
them, so a copy of it without its ``-wal`` file is at most about one checkpoint behind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from foldplane.eventlog import NewRecord, open_log, sqlite_writer

LIMIT = 256 << 10
RECORDS = 400


def in_main_file(db: Path) -> int:
    """The records the main file holds by itself (the WAL ignored, nothing written)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute("SELECT next_seq - 1 FROM log_head WHERE id = 1").fetchone()[0]
    finally:
        conn.close()


async def test_small_commits_are_checkpointed_into_the_main_file(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_WAL_BYTES", LIMIT)
    db = tmp_path / "log.db"
    log = await open_log(db)
    try:
        for i in range(RECORDS):  # one record per commit: pages, not payload, fill the WAL
            await log.append([NewRecord(kind="tick", group=None, payload={"i": i})])
        # counted by payload (a few bytes a record) no checkpoint was ever due and the main
        # file held none of them; counted by the WAL's size one is due every LIMIT bytes
        assert in_main_file(db) >= RECORDS // 2
    finally:
        await log.close()
