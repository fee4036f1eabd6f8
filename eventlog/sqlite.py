"""The SQLite store: the embedded default.

- One writer thread (``SqliteWriter``): WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``, group
  commit. Offsets and the term check come from the ``log_head`` row inside the write lock, so
  several processes may open the same file: their appends serialize on SQLite's lock and stay
  gap-free, and a claimed term fences the others.
- One reader thread with a ``query_only`` connection: reads and checksum verification run off
  the event loop.
- One small ``query_only`` connection used on the event loop itself, for the cheap head query
  and the ``PRAGMA data_version`` poll that notices other processes' commits.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from .base import (
    Log,
    RemovedRange,
    Row,
    Sealed,
    check_compaction,
    missing_offsets,
)
from .codec import COLUMNS, decode_rows, gc_paused
from .errors import LogError
from .migrate import check_known, code_head, migrate_sqlite
from .projection import ProjectionRow, decode_projection
from .record import Record
from .sqlite_writer import Append, Call, SqliteWriter


def _connect_reader(path: Path, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        # SQLite itself refuses every write. Without a -wal file beside it no writer is at
        # work, so the file is read as immutable: no -shm or -wal file is created either.
        quiet = "" if Path(f"{path}-wal").exists() else "&immutable=1"
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro{quiet}"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
    else:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA query_only = 1")
    return conn


class SqliteLog(Log):
    def __init__(
        self, path: Path, where: str, term: int, head: int, *, read_only: bool = False
    ) -> None:
        super().__init__(where, term, head)
        self._path = path
        self._read_only = read_only
        self._loop = asyncio.get_running_loop()
        #: None when opened read-only: nothing can write (open_sqlite_read_only)
        self._writer = (
            None if read_only else SqliteWriter(path, where, self._loop, term, self._committed)
        )
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(1, thread_name_prefix="eventlog-sqlite-reader")
        self._watch_conn = _connect_reader(path, read_only)
        self._data_version = self._watch_conn.execute("PRAGMA data_version").fetchone()[0]

    # -- writes -----------------------------------------------------------------------------

    def _append_rows(self, rows: list[Row]) -> asyncio.Future[Sealed]:
        # A plain function handing back the writer's future: one coroutine less per append.
        fut: asyncio.Future[Sealed] = self._loop.create_future()
        # size approximates the WAL bytes: the payload plus the other columns and row header
        size = 64 * len(rows)
        for row in rows:
            size += len(row[4])
        self._writable().submit(Append(rows, size, fut))
        return fut

    async def _write(self, fn: Any, *, durable: bool = True) -> Any:
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._writable().submit(Call(fn, fut, durable))
        return await fut

    async def _claim_term(self) -> int:
        writer = self._writable()

        def claim(conn: sqlite3.Connection) -> int:
            (term,) = conn.execute(
                "UPDATE log_head SET term = term + 1 WHERE id = 1 RETURNING term"
            ).fetchone()
            writer.term = term
            return term

        return await self._write(claim)

    async def _set_consumer_offset(self, name: str, offset: int) -> None:
        await self._write(lambda conn: _store_offset(conn, self.where, name, offset))

    async def _write_projections(
        self, rows: list[tuple[str, str, int, bytes]], consumer: str, offset: int, durable: bool
    ) -> None:
        def write(conn: sqlite3.Connection) -> None:
            _store_offset(conn, self.where, consumer, offset)
            conn.executemany(
                "INSERT INTO projection (kind, grp, seq, doc) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, grp, seq) DO UPDATE SET doc = excluded.doc",
                rows,
            )

        await self._write(write, durable=durable)

    async def _save_snapshot(self, name: str, offset: int, data: bytes) -> None:
        await self._write(
            lambda conn: conn.execute(
                "INSERT INTO snapshot (name, seq, data) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, data = excluded.data",
                (name, offset, data),
            )
        )

    async def _compact(
        self, name: str, offset: int, data: bytes, remove: list[int], previous: bytes | None
    ) -> RemovedRange | None:
        where = self.where

        def step(conn: sqlite3.Connection) -> RemovedRange | None:
            # inside the writer's BEGIN IMMEDIATE: these checks and the deletes see one state
            head = conn.execute("SELECT next_seq - 1 FROM log_head WHERE id = 1").fetchone()[0]
            kept = conn.execute(
                "SELECT max(seq) FROM kept_snapshot WHERE name = ?", (name,)
            ).fetchone()[0]
            removed_to = conn.execute("SELECT max(last_seq) FROM removed_range").fetchone()[0]
            check_compaction(where, name, offset, remove, head, kept or 0, removed_to or 0)
            conn.execute(
                "INSERT INTO kept_snapshot (name, seq, data) VALUES (?, ?, ?)", (name, offset, data)
            )
            if previous is not None and kept is not None:
                conn.execute(
                    "UPDATE kept_snapshot SET data = ? WHERE name = ? AND seq = ?",
                    (previous, name, kept),
                )
            if not remove:
                return None
            # one statement for the whole set: no per-row trip through the GIL
            gone = conn.execute(
                "DELETE FROM log WHERE seq IN (SELECT value FROM json_each(?))",
                (json.dumps(remove),),
            ).rowcount
            if gone != len(remove):
                raise ValueError(missing_offsets(where, remove, gone))
            removed = RemovedRange(remove[0], remove[-1], gone)
            conn.execute(
                "INSERT INTO removed_range (first_seq, last_seq, removed) VALUES (?, ?, ?)",
                (removed.first, removed.last, removed.removed),
            )
            return removed

        return await self._write(step)

    # -- reads ------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _connect_reader(self._path, self._read_only)
        return conn

    async def _query(self, fn: Any, *args: Any) -> Any:
        def run() -> Any:
            try:
                return fn(self._reader(), *args)
            except sqlite3.DatabaseError as exc:
                raise LogError(f"reading {self.where} failed: {exc}") from exc

        return await self._loop.run_in_executor(self._readers, run)

    async def _read(
        self,
        after: int,
        limit: int,
        group: str | None,
        kinds: list[str] | None,
        until: int | None,
    ) -> list[Record]:
        sql = f"SELECT {COLUMNS} FROM log WHERE seq > ?"
        params: list[Any] = [after]
        if until is not None:
            sql += " AND seq <= ?"
            params.append(until)
        if group is not None:
            sql += " AND grp = ?"
            params.append(group)
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        sql += " ORDER BY seq LIMIT ?"
        params.append(limit)

        def run(conn: sqlite3.Connection) -> list[Record]:
            try:
                with gc_paused():  # the fetch allocates a tuple per row; see gc_paused
                    return decode_rows(conn.execute(sql, params).fetchall())
            except sqlite3.DatabaseError as exc:
                raise LogError(f"reading {self.where} after offset {after} failed: {exc}") from exc

        return await self._query(run)

    async def _read_head(self) -> int:
        try:
            return self._watch_conn.execute("SELECT next_seq - 1 FROM log_head").fetchone()[0]
        except sqlite3.Error as exc:
            raise LogError(f"reading the head of {self.where} failed: {exc}") from exc

    async def _poll_head(self) -> int | None:
        version = self._watch_conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return None
        self._data_version = version
        return await self._read_head()

    async def _get_consumer_offset(self, name: str) -> int:
        def run(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT seq FROM consumer_offset WHERE consumer = ?", (name,)
            ).fetchone()
            return 0 if row is None else row[0]

        return await self._query(run)

    async def _read_projections(
        self, kind: str, group: str | None, after_seq: int, limit: int
    ) -> list[ProjectionRow]:
        sql = "SELECT kind, grp, seq, doc FROM projection WHERE kind = ? AND seq > ?"
        params: list[Any] = [kind, after_seq]
        if group is not None:
            sql += " AND grp = ?"
            params.append(group)
        sql += " ORDER BY grp, seq LIMIT ?"
        params.append(limit)
        return await self._query(
            lambda conn: [decode_projection(*r) for r in conn.execute(sql, params).fetchall()]
        )

    async def _get_projection(self, kind: str, group: str, seq: int) -> ProjectionRow | None:
        def run(conn: sqlite3.Connection) -> ProjectionRow | None:
            row = conn.execute(
                "SELECT kind, grp, seq, doc FROM projection WHERE kind = ? AND grp = ? AND seq = ?",
                (kind, group, seq),
            ).fetchone()
            return None if row is None else decode_projection(*row)

        return await self._query(run)

    async def _load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        def run(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            row = conn.execute("SELECT seq, data FROM snapshot WHERE name = ?", (name,)).fetchone()
            return None if row is None else (row[0], bytes(row[1]))

        return await self._query(run)

    async def _removed_ranges(self, after: int, until: int | None) -> list[RemovedRange]:
        sql = "SELECT first_seq, last_seq, removed FROM removed_range WHERE last_seq > ?"
        params: list[Any] = [after]
        if until is not None:
            sql += " AND first_seq <= ?"
            params.append(until)
        sql += " ORDER BY first_seq"
        return await self._query(
            lambda conn: [RemovedRange(*r) for r in conn.execute(sql, params).fetchall()]
        )

    async def _kept_snapshots(self, name: str) -> list[int]:
        return await self._query(
            lambda conn: [
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM kept_snapshot WHERE name = ? ORDER BY seq", (name,)
                ).fetchall()
            ]
        )

    async def _load_kept_snapshot(self, name: str, offset: int) -> bytes | None:
        def run(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute(
                "SELECT data FROM kept_snapshot WHERE name = ? AND seq = ?", (name, offset)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._query(run)

    async def _stored_bytes(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            return (pages - free) * conn.execute("PRAGMA page_size").fetchone()[0]

        return await self._query(run)

    # -- closing ----------------------------------------------------------------------------

    def _writable(self) -> SqliteWriter:
        if self._writer is None:
            raise LogError(f"{self.where} was opened read-only; nothing can be written to it")
        return self._writer

    async def _close(self) -> None:
        if self._writer is not None:
            await asyncio.to_thread(self._writer.stop)

        def close_reader() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()

        await self._loop.run_in_executor(self._readers, close_reader)
        self._readers.shutdown(wait=True)
        self._watch_conn.close()


def _store_offset(conn: sqlite3.Connection, where: str, name: str, offset: int) -> None:
    """Upsert a consumer offset; refuse to move it backwards (the caller's transaction rolls back)."""
    row = conn.execute("SELECT seq FROM consumer_offset WHERE consumer = ?", (name,)).fetchone()
    if row is not None and row[0] > offset:
        raise ValueError(
            f"consumer {name!r} of {where} is at offset {row[0]}; refusing to move it back to {offset}"
        )
    conn.execute(
        "INSERT INTO consumer_offset (consumer, seq) VALUES (?, ?) "
        "ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq",
        (name, offset),
    )


async def open_sqlite(path: Path, create: bool, *, adopt_empty: bool = False) -> SqliteLog:
    """Open (creating and migrating as needed) the SQLite log at ``path``.

    A log is created only where no file is (with ``create``), or in an empty file (no byte, or
    a SQLite database without a table) when ``adopt_empty`` says so. Any other file that is not
    a foldplane log is refused, naming what it is, before anything is written to it."""
    where = f"SQLite log {str(path)!r}"
    if not path.exists():
        if not create:
            raise LogError(f"{where} does not exist")
        if not path.parent.is_dir():
            raise LogError(f"cannot create {where}: directory {str(path.parent)!r} does not exist")
    elif path.is_dir():
        raise LogError(f"{where} is a directory, not a SQLite file")
    else:
        found = await asyncio.to_thread(_what_is, path)
        blank = found is not None and found.empty and create and not adopt_empty
        if blank and not await asyncio.to_thread(_stays_blank, path):
            found = None  # another opener was creating the log in it: it is one now
        if found is not None and not (found.empty and create and adopt_empty):
            if found.empty and create:
                raise LogError(
                    f"{found.text}; a new log is created only where no file is (give a path "
                    "that does not exist), or in an empty file with serve's --init-empty"
                )
            raise LogError(found.text)

    def prepare() -> tuple[int, int]:
        migrate_sqlite(path, where)
        conn = _connect_reader(path)
        try:
            return conn.execute("SELECT term, next_seq - 1 FROM log_head WHERE id = 1").fetchone()
        finally:
            conn.close()

    try:
        term, head = await asyncio.to_thread(prepare)
    except sqlite3.DatabaseError as exc:
        raise LogError(f"cannot open {where}: {exc}") from exc
    return SqliteLog(path, where, term, head)


#: The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"
#: The tables every foldplane log has, whatever its revision.
_LOG_TABLES = frozenset({"log", "alembic_version"})


class _Found(NamedTuple):
    """What a file that is not a foldplane log is: ``text`` names it; ``empty``: no byte, or a
    SQLite database without a table (a new log may be made in it when asked)."""

    text: str
    empty: bool


def _what_is(path: Path) -> _Found | None:
    """None for a foldplane log (a SQLite database with its tables), else what the file is.
    Reads only: the file is opened read-only, and as immutable (no -wal or -shm file is
    made) unless a writer's -wal file is beside it."""
    with open(path, "rb") as f:
        header = f.read(len(_SQLITE_HEADER))
    if not header:
        return _Found(f"{str(path)!r} is an empty file, not a foldplane log", True)
    if header != _SQLITE_HEADER:
        return _Found(
            f"{str(path)!r} is not a foldplane log: not a SQLite database (it starts with "
            f"{header[:12]!r})",
            False,
        )
    conn = _connect_reader(path, read_only=True)
    try:
        tables = sorted(
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        )
    except sqlite3.DatabaseError as exc:
        return _Found(
            f"{str(path)!r} is not a foldplane log: an unreadable SQLite file ({exc})", False
        )
    finally:
        conn.close()
    if not tables:
        return _Found(f"{str(path)!r} is an empty SQLite database, not a foldplane log", True)
    if not set(tables) >= _LOG_TABLES:
        shown = ", ".join(tables[:12]) + (", ..." if len(tables) > 12 else "")
        return _Found(
            f"{str(path)!r} is not a foldplane log: a SQLite database with tables "
            f"[{shown}] and no foldplane log table",
            False,
        )
    return None


def _stays_blank(path: Path) -> bool:
    """Whether a blank file (no byte, or no table) stays blank, or was another opener's new
    log in the making (two openers of a path that did not exist: the first one's file is blank
    until its migration commits). Waits for the write lock its migration holds, and up to a
    second for one that has not taken it yet; reads only, writes nothing."""
    deadline = time.monotonic() + BLANK_WAIT_S
    while True:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN IMMEDIATE")  # waits while a migration holds the lock
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            conn.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            return False  # not blank after all: what it is, the migration will say
        finally:
            conn.close()
        if tables:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)


#: How long a blank file is watched for another opener's new log (``_stays_blank``).
BLANK_WAIT_S = 1.0


async def open_sqlite_read_only(path: Path) -> SqliteLog:
    """Open the SQLite log at ``path`` for reading only, as audits do: nothing is created,
    migrated or written (SQLite opens the file with ``mode=ro``). A file that is not a foldplane
    log at this code's schema revision is refused, naming what it is."""
    where = f"SQLite log {str(path)!r}"
    if not path.exists():
        raise LogError(f"{where} does not exist")
    if path.is_dir():
        raise LogError(f"{where} is a directory, not a SQLite file")

    def prepare() -> tuple[int, int]:
        found = _what_is(path)
        if found is not None:
            raise LogError(found.text)
        conn = _connect_reader(path, read_only=True)
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = None if row is None else row[0]
            check_known(where, revision)
            if revision != code_head():
                raise LogError(
                    f"{where} has schema revision {revision!r}, older than this code's "
                    f"{code_head()!r}; the coordinator's `serve` migrates it (a write), "
                    "a read-only audit does not"
                )
            return conn.execute("SELECT term, next_seq - 1 FROM log_head WHERE id = 1").fetchone()
        finally:
            conn.close()

    try:
        term, head = await asyncio.to_thread(prepare)
    except sqlite3.DatabaseError as exc:
        raise LogError(f"cannot open {where} read-only: {exc}") from exc
    return SqliteLog(path, where, term, head, read_only=True)
