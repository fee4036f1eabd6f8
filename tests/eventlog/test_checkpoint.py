"""The SQLite writer checkpoints the WAL by the WAL's own size (eventlog/sqlite_writer.py)."""

from __future__ import annotations

import os
from pathlib import Path

from foldplane.eventlog import NewRecord, open_log
from foldplane.eventlog.sqlite_writer import CHECKPOINT_WAL_BYTES

APPENDS = 1200


async def test_a_log_of_small_records_keeps_its_wal_near_the_checkpoint_size(
    tmp_path: Path,
) -> None:
    # One small record a commit, as shared heartbeat records are: each commit writes whole
    # pages to the WAL (the table's, its index's, the head row's), some 10 kB for 60 bytes of
    # record. Counted by the records' bytes, a checkpoint fell due only after 2 MB of them:
    # the WAL grew past 100 MB first.
    path = tmp_path / "log.db"
    wal = Path(f"{path}-wal")
    log = await open_log(path)
    try:
        largest = written = size = 0
        for i in range(APPENDS):
            rec = NewRecord(kind="heartbeat", group="g", rank=None, payload={"ranks": [i]})
            await log.append([rec])
            now = os.stat(wal).st_size
            written += now - size if now >= size else now  # smaller: it started over
            size, largest = now, max(largest, now)
        assert written > 2 * CHECKPOINT_WAL_BYTES  # the commits wrote enough to start over
        assert largest <= 2 * CHECKPOINT_WAL_BYTES, f"the WAL reached {largest:,} bytes"
        assert await log.read(after=APPENDS - 1, limit=5) != []
    finally:
        await log.close()
