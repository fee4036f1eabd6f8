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
  in their own transaction, in queue order with the appends.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventlog.errors import LogClosed, LogError, StaleTermError
from eventlog.record import checksum

MAX_BATCH_ROWS = 8192
MAX_BATCH_BYTES = 8 << 20

_INSERT = (
    "INSERT INTO log (seq, term, ts_ns, kind, grp, rank, payload, crc) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(slots=True)
class Append:
    rows: list[tuple[int, str, str | None, int | None, bytes]]
    size: int
    future: asyncio.Future[list[int]]


@dataclass(slots=True)
class Call:
    """Run ``fn(connection)`` inside its own write transaction; its result resolves ``future``."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]


_STOP = object()


def connect_writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


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
        self._jobs: deque[Append | Call | object] = deque()
        self._cv = threading.Condition()
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(
            target=self._run, name="eventlog-sqlite-writer", daemon=True
        )
        self._thread.start()

    # -- called on the event loop -----------------------------------------------------------

    def submit(self, job: Append | Call) -> None:
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()

    def stop(self) -> None:
        """Finish the queued jobs, then close the connection (blocks: call it off the loop)."""
        with self._cv:
            self._jobs.append(_STOP)
            self._cv.notify()
        self._thread.join()

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    self._cv.wait()
                first = self._jobs.popleft()
                if first is _STOP:
                    break
                batch: list[Any] = [first]
                if isinstance(first, Append):
                    rows, size = len(first.rows), first.size
                    while self._jobs and isinstance(self._jobs[0], Append):
                        nxt = self._jobs[0]
                        if (
                            rows + len(nxt.rows) > MAX_BATCH_ROWS
                            or size + nxt.size > MAX_BATCH_BYTES
                        ):
                            break
                        self._jobs.popleft()
                        batch.append(nxt)
                        rows += len(nxt.rows)
                        size += nxt.size
            if isinstance(first, Append):
                self._write_appends(batch)
            else:
                self._write_call(first)
        if self._conn is not None:
            self._conn.close()
        # Anything queued after stop() was requested is refused, never silently dropped.
        with self._cv:
            rest, self._jobs = list(self._jobs), deque()
        closed = LogClosed(f"{self._where} is closed")
        for job in rest:
            if isinstance(job, Append | Call):
                self._fail([job], closed)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect_writer(self._path)
        return self._conn

    def _write_appends(self, jobs: list[Append]) -> None:
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                head_term, seq = conn.execute(
                    "SELECT term, next_seq FROM log_head WHERE id = 1"
                ).fetchone()
                if head_term != self.term:
                    raise StaleTermError(self.term, head_term)
                term = self.term
                params = []
                results = []
                for job in jobs:
                    start = seq
                    for ts, kind, grp, rank, payload in job.rows:
                        crc = checksum(seq, ts, term, kind, grp, rank, payload)
                        params.append((seq, term, ts, kind, grp, rank, payload, crc))
                        seq += 1
                    results.append(list(range(start, seq)))
                conn.executemany(_INSERT, params)
                conn.execute("UPDATE log_head SET next_seq = ? WHERE id = 1", (seq,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except StaleTermError as exc:
            self._fail(jobs, exc)
        except Exception as exc:
            self._reset()
            n = sum(len(j.rows) for j in jobs)
            self._fail(jobs, LogError(f"append of {n} records to {self._where} failed: {exc}"))
        else:
            self._call_soon(self._resolve, jobs, results, seq - 1)

    def _write_call(self, job: Call) -> None:
        try:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = job.fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except (LogError, ValueError) as exc:
            self._fail([job], exc)
        except Exception as exc:
            self._reset()
            self._fail([job], LogError(f"write to {self._where} failed: {exc}"))
        else:
            self._call_soon(_set_result, job.future, result)

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

    def _resolve(self, jobs: list[Append], results: list[list[int]], head: int) -> None:
        for job, offsets in zip(jobs, results, strict=True):
            if not job.future.done():
                job.future.set_result(offsets)
        self._on_commit(head)


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
