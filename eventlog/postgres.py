"""The PostgreSQL store: the shared log for several coordinators, one writer at a time.

Rules, and why:

- Every append is ONE statement (no explicit transaction, one round trip): it checks the
  writer's term against the ``log_head`` row, advances ``next_seq``, inserts the batch at the
  offsets the writer expected, and sends a NOTIFY. The head row's lock serializes appends, so
  offsets commit in order and gap-free (a rolled-back statement also rolls back ``next_seq``),
  and readers never see a later offset before an earlier one.
- The statement inserts nothing unless the head still holds this writer's term and the
  expected ``next_seq``. Checksums cover the offset, so the writer computes them for the offsets
  it expects. If the term moved, the batch fails with StaleTermError (nothing written); if only
  ``next_seq`` moved (another writer under the same term), the writer re-reads it and retries.
- The other writes (projection rows with the consumer offset, the offset alone, the snapshot)
  are fenced by the same term: each is one statement whose rows come from the head row locked
  ``FOR KEY SHARE`` while it holds the writer's term, and ``claim_term`` locks that row ``FOR
  UPDATE`` before it moves the term, so it waits for such a write in flight and every later
  one writes nothing (StaleTermError). Appends neither wait for them nor block them.
- Group commit: one writer task sends whatever appends queued up while the previous statement
  was in flight, as one statement (up to ``MAX_BATCH_ROWS``).
- Wake-ups across processes: LISTEN on a channel named after the schema; a NOTIFY is only a
  hint (it carries the new head), so a waiter also polls the head row every second as a safety
  net against a lost connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from .base import (
    Log,
    RemovedRange,
    Row,
    Sealed,
    check_compaction,
    missing_offsets,
)
from .codec import COLUMNS, decode_rows
from .errors import LogClosed, LogError, StaleTermError
from .failpoints import stop_point
from .migrate import check_known, code_head, migrate_postgres, postgres_revision
from .projection import ProjectionRow, decode_projection
from .record import Record, frame_body, seal
from .target import PostgresTarget

MAX_BATCH_ROWS = 8192

_APPEND = """
WITH h AS (
    UPDATE log_head SET next_seq = next_seq + $3::bigint
    WHERE id = 1 AND term = $1 AND next_seq = $2
    RETURNING next_seq
), ins AS (
    INSERT INTO log (seq, term, kind, grp, frame)
    SELECT $2 + u.ord - 1, $1, u.kind, u.grp, u.frame
    FROM h, unnest($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS u(kind, grp, frame, ord)
    RETURNING seq
)
SELECT i.n, CASE WHEN i.n > 0 THEN pg_notify($7, i.last::text) END
FROM (SELECT count(*) AS n, max(seq) AS last FROM ins) AS i
"""

#: The fence of every write besides the append: the statement's rows come from this one, so it
#: writes nothing unless the head row still holds the writer's term (``$term``). ``FOR KEY
#: SHARE`` does not wait for appends (they update ``next_seq``, no key), but the claim of a
#: new term locks the row ``FOR UPDATE`` first, so it waits for a fenced write in flight, and
#: a fenced write that comes after it finds the new term and writes nothing.
_FENCE = "SELECT 1 FROM log_head WHERE id = 1 AND term = $term FOR KEY SHARE"

_STORE_OFFSET_UPSERT = """
INSERT INTO consumer_offset (consumer, seq) SELECT $1, $2 FROM f
ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq
WHERE consumer_offset.seq <= excluded.seq
RETURNING seq
"""

#: Moves the consumer's offset (never back); nothing when refused or fenced.
_STORE_OFFSET = f"""
WITH f AS ({_FENCE.replace("$term", "$3")})
{_STORE_OFFSET_UPSERT.strip()}
"""

#: Moves the consumer's offset and upserts the projection rows in one statement; the rows are
#: joined to the offset's upsert, so a refused offset writes no row either. Returns how many
#: offsets moved (0: refused or fenced).
_WRITE_PROJECTIONS = f"""
WITH f AS ({_FENCE.replace("$term", "$7")}),
o AS ({_STORE_OFFSET_UPSERT.strip()}),
p AS (
    INSERT INTO projection (kind, grp, seq, doc)
    SELECT u.kind, u.grp, u.seq, u.doc
    FROM o, unnest($3::text[], $4::text[], $5::bigint[], $6::bytea[]) AS u (kind, grp, seq, doc)
    ON CONFLICT (kind, grp, seq) DO UPDATE SET doc = excluded.doc
)
SELECT count(*) FROM o
"""

_SAVE_SNAPSHOT = f"""
WITH f AS ({_FENCE.replace("$term", "$4")})
INSERT INTO snapshot (name, seq, data) SELECT $1, $2, $3 FROM f
ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, data = excluded.data
RETURNING seq
"""

#: The claim of a coordinator elected by the lease: it moves the term only while the lease row
#: still holds its generation, unexpired (locked ``FOR SHARE``, so no claim of the lease
#: commits meanwhile). A claimant paused between winning the lease and this statement, and
#: outlived by its lease, moves nothing.
_CLAIM_TERM_UNDER_LEASE = """
WITH l AS (SELECT id FROM log_head WHERE id = 1 FOR UPDATE),
k AS (
    SELECT 1 FROM leader_lease
    WHERE id = 1 AND holder = $1 AND generation = $2 AND expires_at > now()
    FOR SHARE
)
UPDATE log_head SET term = term + 1 FROM l, k WHERE log_head.id = l.id
RETURNING log_head.term, log_head.next_seq
"""

#: The row is locked ``FOR UPDATE`` before the term moves, so the claim waits for the fenced
#: writes in flight (see ``_FENCE``); an append in flight is waited for as before.
_CLAIM_TERM = """
WITH l AS (SELECT id FROM log_head WHERE id = 1 FOR UPDATE)
UPDATE log_head SET term = term + 1 FROM l WHERE log_head.id = l.id
RETURNING log_head.term, log_head.next_seq
"""


@dataclass(slots=True)
class _Append:
    rows: list[Row]
    future: asyncio.Future[Sealed]


class PostgresLog(Log):
    #: The safety-net poll; NOTIFY wakes waiters much sooner.
    poll_interval = 1.0

    def __init__(
        self,
        where: str,
        term: int,
        next_seq: int,
        channel: str,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        writer: asyncpg.Connection,
        listener: asyncpg.Connection,
        pool: asyncpg.Pool,
    ) -> None:
        super().__init__(where, term, next_seq - 1)
        self._next_seq = next_seq
        self._channel = channel
        self._connect = connect
        self._conn = writer
        self._listener = listener
        self._pool = pool
        self._jobs: deque[_Append] = deque()
        self._has_jobs = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._writer_task = asyncio.get_running_loop().create_task(self._write_loop())

    # -- the writer -------------------------------------------------------------------------

    def _append_rows(self, rows: list[Row]) -> asyncio.Future[Sealed]:
        fut: asyncio.Future[Sealed] = asyncio.get_running_loop().create_future()
        self._jobs.append(_Append(rows, fut))
        self._has_jobs.set()
        return fut

    async def _write_loop(self) -> None:
        while True:
            await self._has_jobs.wait()
            batch: list[_Append] = []
            n = 0
            while self._jobs and (not batch or n + len(self._jobs[0].rows) <= MAX_BATCH_ROWS):
                job = self._jobs.popleft()
                batch.append(job)
                n += len(job.rows)
            if not self._jobs:
                self._has_jobs.clear()
            try:
                async with self._write_lock:
                    results = await self._write_batch(batch)
            except asyncio.CancelledError:
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(LogClosed(f"{self.where} is closed"))
                raise
            except Exception as exc:
                if not isinstance(exc, LogError):
                    exc = LogError(f"append of {n} records to {self.where} failed: {exc}")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
            else:
                for job, sealed in zip(batch, results, strict=True):
                    if not job.future.done():
                        job.future.set_result(sealed)
                self._committed(results[-1][0][-1])

    async def _writer(self) -> asyncpg.Connection:
        """The writer's connection; a lost one is replaced (the next statement re-checks the head)."""
        if self._conn.is_closed():
            self._conn = await self._connect()
        return self._conn

    async def _write_batch(self, batch: list[_Append]) -> list[Sealed]:
        conn = await self._writer()
        rows = [row for job in batch for row in job.rows]
        kinds = [r[1] for r in rows]
        groups = [r[2] for r in rows]
        while True:
            term, first = self._term, self._next_seq
            sealed = [
                seal(frame_body(first + i, t, term, k, g, r, p))
                for i, (t, k, g, r, p) in enumerate(rows)
            ]
            frames = [frame for frame, _ in sealed]
            stop_point("append")
            n, _ = await conn.fetchrow(
                _APPEND, term, first, len(rows), kinds, groups, frames, self._channel
            )
            if n == len(rows):
                break
            head_term, next_seq = await conn.fetchrow(
                "SELECT term, next_seq FROM log_head WHERE id = 1"
            )
            if head_term != term:
                raise StaleTermError(term, head_term)
            self._next_seq = next_seq  # another writer under our term appended; go after it
        self._next_seq = first + len(rows)
        results: list[Sealed] = []
        offset = first
        for job in batch:
            n = len(job.rows)
            crcs = [crc for _, crc in sealed[offset - first : offset - first + n]]
            results.append((list(range(offset, offset + n)), crcs))
            offset += n
        return results

    async def _claim_term(self) -> int:
        async with self._write_lock:
            conn = await self._writer()
            term, next_seq = await conn.fetchrow(_CLAIM_TERM)
            self._next_seq = next_seq
            return term

    async def claim_term_under_lease(self, holder: str, generation: int) -> int:
        """:meth:`claim_term`, only while the lease row (migration 0003) holds ``generation``
        of ``holder`` and has not run out; LogError, nothing changed, otherwise."""
        self._check_open()
        async with self._write_lock:
            conn = await self._writer()
            row = await conn.fetchrow(_CLAIM_TERM_UNDER_LEASE, holder, generation)
            if row is None:
                raise LogError(
                    f"{self.where}: lease generation {generation} of {holder} is no longer "
                    "held; the term was not claimed"
                )
            self._term, self._next_seq = row["term"], row["next_seq"]
            return self._term

    # -- other writes -----------------------------------------------------------------------

    async def _set_consumer_offset(self, name: str, offset: int) -> None:
        async with self._pool.acquire() as conn:
            await self._store_offset(conn, name, offset)

    async def _store_offset(self, conn: asyncpg.Connection, name: str, offset: int) -> None:
        if await conn.fetchval(_STORE_OFFSET, name, offset, self._term) is None:
            await self._refuse_offset(conn, name, offset)

    async def _refuse_offset(self, conn: asyncpg.Connection, name: str, offset: int) -> None:
        await self._check_term(conn)
        stored = await conn.fetchval("SELECT seq FROM consumer_offset WHERE consumer = $1", name)
        raise ValueError(
            f"consumer {name!r} of {self.where} is at offset {stored}; "
            f"refusing to move it back to {offset}"
        )

    async def _write_projections(
        self, rows: list[tuple[str, str, int, bytes]], consumer: str, offset: int, durable: bool
    ) -> None:
        # One statement, so no transaction stays open between round trips: a writer frozen
        # there would hold the rows' locks and block the next leader's writes. Always durable
        # (``durable`` is not used): the coordinators outlive a crash of the server, which could
        # undo a commit made with synchronous_commit off after a standby saw it.
        latest = {(kind, grp, seq): doc for kind, grp, seq, doc in rows}  # the last one wins
        stop_point("projections")
        async with self._pool.acquire() as conn:
            moved = await conn.fetchval(
                _WRITE_PROJECTIONS,
                consumer,
                offset,
                [k[0] for k in latest],
                [k[1] for k in latest],
                [k[2] for k in latest],
                list(latest.values()),
                self._term,
            )
            if not moved:
                await self._refuse_offset(conn, consumer, offset)

    async def _save_snapshot(self, name: str, offset: int, data: bytes) -> None:
        stop_point("snapshot")
        async with self._pool.acquire() as conn:
            if await conn.fetchval(_SAVE_SNAPSHOT, name, offset, data, self._term) is None:
                await self._check_term(conn)

    async def _check_term(self, conn: asyncpg.Connection) -> None:
        """Raise StaleTermError if another writer claimed the log since this one did (a fenced
        write then wrote nothing)."""
        head_term = await conn.fetchval("SELECT term FROM log_head WHERE id = 1")
        if head_term != self._term:
            raise StaleTermError(self._term, head_term)

    async def _compact(
        self, name: str, offset: int, data: bytes, remove: list[int], previous: bytes | None
    ) -> RemovedRange | None:
        # One transaction; an advisory lock keeps two compactors of this schema in turn. It
        # locks no row an append needs: appends only insert after the head.
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))", f"foldplane-compact:{self._channel}"
            )
            head = await conn.fetchval("SELECT next_seq - 1 FROM log_head WHERE id = 1")
            kept = await conn.fetchval("SELECT max(seq) FROM kept_snapshot WHERE name = $1", name)
            removed_to = await conn.fetchval("SELECT max(last_seq) FROM removed_range")
            check_compaction(self.where, name, offset, remove, head, kept or 0, removed_to or 0)
            await conn.execute(
                "INSERT INTO kept_snapshot (name, seq, data) VALUES ($1, $2, $3)",
                name,
                offset,
                data,
            )
            if previous is not None and kept is not None:
                await conn.execute(
                    "UPDATE kept_snapshot SET data = $1 WHERE name = $2 AND seq = $3",
                    previous,
                    name,
                    kept,
                )
            if not remove:
                return None
            gone = await conn.fetchval(
                "WITH d AS (DELETE FROM log WHERE seq = ANY($1::bigint[]) RETURNING 1) "
                "SELECT count(*) FROM d",
                remove,
            )
            if gone != len(remove):
                raise ValueError(missing_offsets(self.where, remove, gone))  # rolls back
            removed = RemovedRange(remove[0], remove[-1], gone)
            await conn.execute(
                "INSERT INTO removed_range (first_seq, last_seq, removed) VALUES ($1, $2, $3)",
                removed.first,
                removed.last,
                removed.removed,
            )
            return removed

    # -- reads ------------------------------------------------------------------------------

    async def _read(
        self,
        after: int,
        limit: int,
        group: str | None,
        kinds: list[str] | None,
        until: int | None,
    ) -> list[Record]:
        sql = f"SELECT {COLUMNS} FROM log WHERE seq > $1"
        params: list[Any] = [after]
        if until is not None:
            params.append(until)
            sql += f" AND seq <= ${len(params)}"
        if group is not None:
            params.append(group)
            sql += f" AND grp = ${len(params)}"
        if kinds is not None:
            params.append(kinds)
            sql += f" AND kind = ANY(${len(params)}::text[])"
        params.append(limit)
        sql += f" ORDER BY seq LIMIT ${len(params)}"
        rows = await self._pool.fetch(sql, *params)
        return decode_rows(rows)

    async def _read_head(self) -> int:
        return await self._pool.fetchval("SELECT next_seq - 1 FROM log_head WHERE id = 1")

    async def _poll_head(self) -> int | None:
        return await self._read_head()

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            self._advance(int(payload))

    async def _get_consumer_offset(self, name: str) -> int:
        value = await self._pool.fetchval(
            "SELECT seq FROM consumer_offset WHERE consumer = $1", name
        )
        return 0 if value is None else value

    async def _read_projections(
        self, kind: str, group: str | None, after_seq: int, limit: int
    ) -> list[ProjectionRow]:
        if group is None:
            rows = await self._pool.fetch(
                "SELECT kind, grp, seq, doc FROM projection WHERE kind = $1 AND seq > $2 "
                "ORDER BY grp, seq LIMIT $3",
                kind,
                after_seq,
                limit,
            )
        else:
            rows = await self._pool.fetch(
                "SELECT kind, grp, seq, doc FROM projection WHERE kind = $1 AND seq > $2 "
                "AND grp = $3 ORDER BY grp, seq LIMIT $4",
                kind,
                after_seq,
                group,
                limit,
            )
        return [decode_projection(*r) for r in rows]

    async def _get_projection(self, kind: str, group: str, seq: int) -> ProjectionRow | None:
        row = await self._pool.fetchrow(
            "SELECT kind, grp, seq, doc FROM projection WHERE kind = $1 AND grp = $2 AND seq = $3",
            kind,
            group,
            seq,
        )
        return None if row is None else decode_projection(*row)

    async def _load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        row = await self._pool.fetchrow("SELECT seq, data FROM snapshot WHERE name = $1", name)
        return None if row is None else (row[0], bytes(row[1]))

    async def _removed_ranges(self, after: int, until: int | None) -> list[RemovedRange]:
        if until is None:
            rows = await self._pool.fetch(
                "SELECT first_seq, last_seq, removed FROM removed_range WHERE last_seq > $1 "
                "ORDER BY first_seq",
                after,
            )
        else:
            rows = await self._pool.fetch(
                "SELECT first_seq, last_seq, removed FROM removed_range WHERE last_seq > $1 "
                "AND first_seq <= $2 ORDER BY first_seq",
                after,
                until,
            )
        return [RemovedRange(*r) for r in rows]

    async def _kept_snapshots(self, name: str) -> list[int]:
        rows = await self._pool.fetch(
            "SELECT seq FROM kept_snapshot WHERE name = $1 ORDER BY seq", name
        )
        return [r[0] for r in rows]

    async def _load_kept_snapshot(self, name: str, offset: int) -> bytes | None:
        data = await self._pool.fetchval(
            "SELECT data FROM kept_snapshot WHERE name = $1 AND seq = $2", name, offset
        )
        return None if data is None else bytes(data)

    async def _stored_bytes(self) -> int:
        return await self._pool.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        )

    # -- closing ----------------------------------------------------------------------------

    async def _close(self) -> None:
        # Let queued appends finish, then stop the writer.
        while self._jobs:
            await asyncio.sleep(0.001)
        async with self._write_lock:
            self._writer_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer_task
        with contextlib.suppress(Exception):
            await self._listener.remove_listener(self._channel, self._on_notify)
        for conn in (self._listener, self._conn):
            with contextlib.suppress(Exception):
                await conn.close()
        await self._pool.close()


def _channel(schema: str | None) -> str:
    return f"foldplane_log_{schema or 'public'}"[:63]


async def open_postgres(
    target: PostgresTarget, create: bool, *, read_only: bool = False
) -> PostgresLog:
    """Connect, migrate if needed, and start the writer and the listener.

    ``read_only`` (audits): nothing is created or migrated, a schema that holds no foldplane
    log (or one of an older revision) is refused naming what it holds, and the writer's and
    the readers' sessions are read-only transactions, so PostgreSQL refuses any write."""
    where = target.describe()
    settings = {"search_path": target.schema} if target.schema else {}
    if read_only:
        settings = {**settings, "default_transaction_read_only": "on"}

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(target.dsn, server_settings=settings)

    try:
        writer = await connect()
    except (OSError, asyncpg.PostgresError) as exc:
        raise LogError(f"cannot connect to {where}: {exc}") from exc
    try:
        revision = await postgres_revision(writer)
        if read_only and revision != code_head():
            await _refuse_for_audit(writer, where, revision)
        if revision is None:  # before any write: a schema of something else is left alone
            await _refuse_foreign(writer, where, create)
        if revision != code_head():
            await migrate_postgres(target.dsn, target.schema, where, create)
        row = await writer.fetchrow("SELECT term, next_seq FROM log_head WHERE id = 1")
        listener = await connect()
        pool = await asyncpg.create_pool(
            target.dsn, min_size=1, max_size=4, server_settings=settings
        )
    except BaseException:
        await writer.close()
        raise
    channel = _channel(target.schema)
    log = PostgresLog(where, row["term"], row["next_seq"], channel, connect, writer, listener, pool)
    await listener.add_listener(channel, log._on_notify)
    return log


async def _tables(conn: asyncpg.Connection) -> str:
    """The tables of the session's schema, for a message: ``users, orders, ...`` (at most 12)."""
    tables = [
        r["tablename"]
        for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "ORDER BY tablename LIMIT 13"
        )
    ]
    return ", ".join(tables[:12]) + (", ..." if len(tables) > 12 else "")


async def _refuse_foreign(conn: asyncpg.Connection, where: str, create: bool) -> None:
    """A writable open of a schema without a foldplane log (``serve``, ``compact``): a new log
    is made only in an empty schema, and only where ``create`` allows; a schema that holds
    other tables (another application's database) is refused naming them, and nothing is
    created, migrated or written there (as a SQLite file that is not a foldplane log)."""
    shown = await _tables(conn)
    if shown:
        raise LogError(
            f"{where} holds no foldplane log (tables: [{shown}]); foldplane makes a new log "
            "only in an empty schema and wrote nothing here (name another database, or a "
            "schema of its own with ?schema=NAME)"
        )
    if not create:
        raise LogError(f"{where} does not exist (an empty schema, no foldplane log)")


async def _refuse_for_audit(conn: asyncpg.Connection, where: str, revision: str | None) -> None:
    """Why a read-only open cannot read ``where``: no foldplane log there (naming the tables it
    found), a newer foldplane's schema, or an older one that only ``serve`` migrates."""
    if revision is None:
        raise LogError(f"{where} holds no foldplane log (tables: [{await _tables(conn)}])")
    check_known(where, revision)
    raise LogError(
        f"{where} has schema revision {revision!r}, older than this code's {code_head()!r}; "
        "the coordinator's `serve` migrates it (a write), a read-only audit does not"
    )
