"""The SQLite group-commit writer: one thread owns the only writing connection.

Rules, and why:

- Callers queue jobs; the thread takes every append job queued so far (up to
  ``MAX_BATCH_ROWS``/``MAX_BATCH_BYTES``) and writes them in ONE transaction:
  ``BEGIN IMMEDIATE`` → read the head row → ``executemany`` → advance the head → ``COMMIT``.
  Batches form while the previous commit is in flight, so there is no linger timer: a lone
  append pays one fsync, a thousand concurrent appends share a handful.
- A job is never split across transactions, so one ``append`` call is atomic.
- Offsets come from the head row inside the write lock, and the head's term is checked there
  too: a writer whose term is stale writes nothing and its jobs fail with StaleTermError.
- Futures are resolved only after COMMIT returned (``synchronous=FULL``: the WAL is fsynced),
  through ``loop.call_soon_threadsafe`` — once per batch, not once per job.
- Other writes (consumer offsets, projections, snapshots, claiming a term) are ``Call`` jobs run
  in their own transaction, in queue order with the appends. A Call marked not durable (the
  projections, which are derived from the log) commits without an fsync: the next append's
  fsync syncs the WAL behind it, so only records pay for one.
- Several Logs on one file (other processes, or other openers in this one) take turns through
  an exclusive ``flock`` on ``<file>-writer.lock`` held around each write transaction. SQLite's
  own lock has no queue: a writer that finds it taken sleeps and retries with a backoff of up to
  100 ms, so contending Logs spend most of their time asleep with the lock free (the
  ``eventlog`` benchmark's "a Log per caller" row; figures in docs/benchmarks.md). A blocked
  ``flock`` wakes as soon as the holder releases it, and the kernel drops it when a holder dies.
- The WAL is checkpointed by its own size, beside the writer (:class:`Checkpointer`), whose
  last step takes the same lock for a moment and empties the WAL file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zlib import crc32

from .base import Sealed
from .errors import LogClosed, LogError, StaleTermError
from .record import frame_names

MAX_BATCH_ROWS = 8192
MAX_BATCH_BYTES = 8 << 20

#: Rows per INSERT statement at most. Each statement inserts a power of two of rows (a batch of
#: 100 goes in as 64 + 32 + 4), so a handful of prepared statements serve every batch size.
#: One multi-row statement is one ``sqlite3_step``: ``executemany`` would step, and so drop and
#: retake the GIL, once per row, fighting the event loop thread for it on every record. SQLite
#: builds before 3.32 allow only 999 parameters a statement; ``chunk_rows`` honours the limit.
CHUNK_ROWS = 256


#: Values per inserted row: seq, term, kind, grp, frame.
ROW_VALUES = 5


def chunk_rows(conn: sqlite3.Connection) -> int:
    """The largest power of two of rows, at most CHUNK_ROWS, whose ``ROW_VALUES`` parameters
    each fit in one statement on this SQLite."""
    fit = min(CHUNK_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // ROW_VALUES)
    return 1 << (fit.bit_length() - 1)


def _insert_sql(rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO log (seq, term, kind, grp, frame) VALUES {values}"


_INSERTS = {1 << k: _insert_sql(1 << k) for k in range(CHUNK_ROWS.bit_length())}


@dataclass(slots=True)
class Append:
    rows: list[tuple[int, str, str | None, int | None, bytes]]
    size: int
    future: asyncio.Future[Sealed]


@dataclass(slots=True)
class Call:
    """Run ``fn(connection)`` inside its own write transaction; its result resolves ``future``."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    #: False: commit without syncing the WAL (``synchronous=NORMAL`` for this one transaction).
    #: The write is visible at once and survives a crash of the process; a power loss may undo
    #: it, whole, until the next durable commit syncs the WAL behind it. Only for derived data
    #: that the coordinator writes again from the log (projections).
    durable: bool = True


_STOP = object()


#: Checkpoint the WAL into the main file once it holds this many bytes (SQLite's own
#: automatic checkpoint is due at 1,000 pages, 4 MB of 4 kB pages).
CHECKPOINT_WAL_BYTES = 4 << 20


def connect_writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    # Checkpoints run on the Checkpointer's thread, not inside a commit that acks wait for.
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    # When SQLite restarts the WAL after a full checkpoint it cuts the file back to this size,
    # so the file's size stays a measure of what is waiting in it (Checkpointer.wrote).
    conn.execute(f"PRAGMA journal_size_limit = {CHECKPOINT_WAL_BYTES}")
    return conn


#: How long the last step of a checkpoint waits for readers still on the WAL (the writers
#: wait meanwhile); past it the WAL is left to grow until the next checkpoint.
CHECKPOINT_READERS_MS = 50


class Checkpointer:
    """Copies the WAL into the database file on its own thread and connection, by the WAL's
    own size.

    SQLite's automatic checkpoint runs inside the COMMIT that crosses the threshold, so every
    append waiting on that commit would pay for copying and fsyncing the main file. Here a
    PASSIVE checkpoint on another connection copies the WAL beside the writer instead, never
    blocking it; then, holding the writers' file lock (so the writer waits on the lock, only
    for this step), a TRUNCATE checkpoint copies what was committed meanwhile and empties the
    WAL file. Without that last step a writer that commits every few milliseconds never lets
    a PASSIVE checkpoint catch up with the WAL's end, and the WAL never starts over.

    It is due once the WAL file has grown by ``CHECKPOINT_WAL_BYTES`` since the last one was
    asked for. The WAL is what the commits wrote, whole pages (a commit of a 100-byte
    heartbeat record writes about three 4 kB pages, a snapshot its whole size): counting the
    records' bytes instead let the WAL of a log of small records grow to hundreds of MB
    between checkpoints. A checkpoint that readers keep from finishing (for more than
    ``CHECKPOINT_READERS_MS``) leaves the WAL to grow; the next is asked for another
    ``CHECKPOINT_WAL_BYTES`` later.
    """

    def __init__(
        self,
        path: Path,
        turn: Callable[[], contextlib.AbstractContextManager[None]],
        wal_bytes: int | None = None,
    ) -> None:
        self._path = path
        self._turn = turn
        self._wal = Path(f"{path}-wal")
        self._wal_bytes = CHECKPOINT_WAL_BYTES if wal_bytes is None else wal_bytes
        #: the WAL's size when the last checkpoint was asked for
        self._asked_at = 0
        #: checkpoints asked for so far
        self.asked = 0
        self._due = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name="eventlog-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def wrote(self) -> None:
        """Called by the writer after each commit: ask for a checkpoint when one is due."""
        try:
            size = os.stat(self._wal).st_size
        except OSError:
            return
        if size < self._asked_at:  # emptied by the last checkpoint
            self._asked_at = 0
        if size - self._asked_at >= self._wal_bytes:
            self._asked_at = size
            self.asked += 1
            self._due.set()

    def stop(self) -> None:
        self._stopping = True
        self._due.set()
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, timeout=30)
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopping:
                    return
                with contextlib.suppress(sqlite3.Error):  # best effort; the next one retries
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_READERS_MS}")
                    try:
                        with self._turn():
                            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    finally:
                        conn.execute("PRAGMA busy_timeout = 30000")
        finally:
            conn.close()


class SqliteWriter:
    def __init__(
        self,
        path: Path,
        where: str,
        loop: asyncio.AbstractEventLoop,
        term: int,
        on_commit: Callable[[int], None],
    ) -> None:
        self.term = term  # written by the writer thread only (claim), read anywhere
        self._path = path
        self._where = where
        self._loop = loop
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._checkpointer = Checkpointer(path, self._checkpoint_turn)
        self._conn: sqlite3.Connection | None = None
        self._chunk = CHUNK_ROWS
        self._lock_fd: int | None = None
        self._thread = threading.Thread(
            target=self._run, name="eventlog-sqlite-writer", daemon=True
        )
        self._thread.start()

    # -- called on the event loop -----------------------------------------------------------

    def submit(self, job: Append | Call) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        """Finish the queued jobs, then close the connection (blocks: call it off the loop)."""
        self._queue.put(_STOP)
        self._thread.join()

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        carry: Any = None
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                break
            if isinstance(first, Call):
                self._guarded(self._write_call, [first], first)
                continue
            batch = [first]
            rows, size = len(first.rows), first.size
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if (
                    not isinstance(nxt, Append)
                    or rows + len(nxt.rows) > MAX_BATCH_ROWS
                    or size + nxt.size > MAX_BATCH_BYTES
                ):
                    carry = nxt
                    break
                batch.append(nxt)
                rows += len(nxt.rows)
                size += nxt.size
            self._guarded(self._write_appends, batch, batch)
        self._checkpointer.stop()
        if self._conn is not None:
            self._conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        # Anything queued after stop() was requested is refused, never silently dropped.
        closed = LogClosed(f"{self._where} is closed")
        rest = [carry] if carry is not None else []
        while True:
            try:
                rest.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._fail([job for job in rest if isinstance(job, Append | Call)], closed)

    def _guarded(self, write: Callable[..., None], jobs: list[Any], *args: Any) -> None:
        """Run one write; a bug inside it fails these jobs instead of killing the thread.

        A dead writer thread would leave every later ``append`` waiting forever.
        """
        try:
            write(*args)
        except Exception as exc:
            self._reset()
            self._fail(jobs, LogError(f"write to {self._where} failed unexpectedly: {exc!r}"))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect_writer(self._path)
            self._chunk = chunk_rows(self._conn)
        return self._conn

    @contextlib.contextmanager
    def _checkpoint_turn(self) -> Any:
        """The writers' file lock, on a descriptor of the Checkpointer's own (a lock held
        through another open file conflicts with the writer's even in this process)."""
        fd = os.open(f"{self._path}-writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _turn(self) -> Any:
        """Hold the writers' file lock for one transaction (see the module's rules)."""
        if self._lock_fd is None:
            self._lock_fd = os.open(f"{self._path}-writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _write_appends(self, jobs: list[Append]) -> None:
        try:
            with self._turn():
                results, head = self._insert(jobs)
        except StaleTermError as exc:
            self._fail(jobs, exc)
        except Exception as exc:
            self._reset()
            n = sum(len(j.rows) for j in jobs)
            self._fail(jobs, LogError(f"append of {n} records to {self._where} failed: {exc}"))
        else:
            self._call_soon(self._resolve, jobs, results, head)
            self._checkpointer.wrote()

    def _insert(self, jobs: list[Append]) -> tuple[list[Sealed], int]:
        """One transaction holding every job's rows: (each job's offsets and checksums, the
        new head)."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            head_term, seq = conn.execute(
                "SELECT term, next_seq FROM log_head WHERE id = 1"
            ).fetchone()
            if head_term != self.term:
                raise StaleTermError(self.term, head_term)
            term = self.term
            params: list[Any] = []
            extend = params.extend
            results = []
            names: dict[tuple[str, str | None], bytes] = {}
            for job in jobs:
                start = seq
                crcs: list[int] = []
                for ts, kind, grp, rank, payload in job.rows:
                    # record.frame_body and record.seal, inlined: this runs for every record
                    try:
                        kg = names[kind, grp]
                    except KeyError:
                        kg = names[kind, grp] = frame_names(kind, grp)
                    if rank is None:
                        body = b"[%d,%d,%d,%snull,%s" % (seq, ts, term, kg, payload)
                    else:
                        body = b"[%d,%d,%d,%s%d,%s" % (seq, ts, term, kg, rank, payload)
                    crc = crc32(body)
                    crcs.append(crc)
                    extend((seq, term, kind, grp, body + b",%10d]" % crc))
                    seq += 1
                results.append((list(range(start, seq)), crcs))
            _insert_rows(conn, params, self._chunk)
            conn.execute("UPDATE log_head SET next_seq = ? WHERE id = 1", (seq,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return results, seq - 1

    def _write_call(self, job: Call) -> None:
        try:
            with self._turn():
                conn = self._connection()
                if not job.durable:
                    conn.execute("PRAGMA synchronous = NORMAL")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        result = job.fn(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                finally:
                    if not job.durable:
                        conn.execute("PRAGMA synchronous = FULL")
        except (LogError, ValueError) as exc:
            self._fail([job], exc)
        except Exception as exc:
            self._reset()
            self._fail([job], LogError(f"write to {self._where} failed: {exc}"))
        else:
            self._call_soon(_set_result, job.future, result)
            self._checkpointer.wrote()

    def _reset(self) -> None:
        """After an unexpected error, start the next batch on a fresh connection."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _fail(self, jobs: list[Any], exc: BaseException) -> None:
        for job in jobs:
            self._call_soon(_set_exception, job.future, exc)

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        # RuntimeError: the opener's loop is gone; nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    # -- back on the event loop -------------------------------------------------------------

    def _resolve(self, jobs: list[Append], results: list[Sealed], head: int) -> None:
        for job, sealed in zip(jobs, results, strict=True):
            if not job.future.done():
                job.future.set_result(sealed)
        self._on_commit(head)


def _insert_rows(conn: sqlite3.Connection, params: list[Any], chunk: int) -> None:
    """Insert the flattened rows (``ROW_VALUES`` values each) in power-of-two multi-row
    statements of at most ``chunk`` rows."""
    left = len(params) // ROW_VALUES
    at = 0
    while left:
        n = min(chunk, 1 << (left.bit_length() - 1))
        conn.execute(_INSERTS[n], params[at : at + ROW_VALUES * n])
        at += ROW_VALUES * n
        left -= n


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
