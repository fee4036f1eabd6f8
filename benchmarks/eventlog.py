"""The durable log: group-commit appends, ack latency, replay — SQLite and PostgreSQL.

Every figure is the median over trials on a fresh log. Baselines are measured in the same run:

- appends: a naive writer that commits every record on its own (the same schema and
  durability: WAL + ``synchronous=FULL`` on SQLite, an autocommitted statement on PostgreSQL),
  driven by the same 100 concurrent producers;
- replay: the same records in a plain sqlite3 table, one column per field (``seq, ts_ns, term,
  kind, grp, rank, payload, crc``: the layout the log itself used before revision 0004), read
  page by page and each payload decoded with the stdlib ``json``, no checksum check; and the
  bare minimum, the same with msgspec's decoder (no checksum, no ``Record``).

PostgreSQL figures need the server on 127.0.0.1:5432 (``FOLDPLANE_BENCH_PG`` overrides the URL);
each trial uses its own schema, dropped afterwards. Without a server they are left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from ..eventlog import READ_PAGE, Log, NewRecord, open_log
from ..eventlog.record import encode_payload, frame_body, seal
from .harness import (
    Result,
    higher_is_better_ratio,
    median,
    percentile,
)

BENCH = "eventlog"
PG_URL = os.environ.get("FOLDPLANE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
PRODUCERS = (1, 10, 100, 1000)
NAIVE = "naive: one commit per record"


def heartbeat(rank: int, step: int) -> NewRecord:
    """A realistic input: about 150 bytes of payload, like an agent's heartbeat with links."""
    return NewRecord(
        kind="heartbeat",
        group="train",
        rank=rank,
        payload={
            "incarnation": "9f0c3a7e-51d2-4b8e-a0c4-2f6f3c1d9e77",
            "step": step,
            "links": {str(p): "up" for p in range(4)},
            "self_ready": True,
        },
    )


# -- targets -----------------------------------------------------------------------------------


class Targets:
    """Fresh logs for each trial: SQLite files in a temp dir, PostgreSQL schemas."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.schemas: list[str] = []

    def sqlite(self) -> str:
        return str(self.tmp / f"{uuid.uuid4().hex}.db")

    def postgres(self) -> str:
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        self.schemas.append(schema)
        return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"

    async def drop(self) -> None:
        if not self.schemas:
            return
        conn = await asyncpg.connect(PG_URL)
        try:
            for schema in self.schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        self.schemas.clear()


async def pg_available() -> bool:
    try:
        conn = await asyncpg.connect(PG_URL, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.close()
    return True


# -- producers ---------------------------------------------------------------------------------


async def drive(
    append: Callable[[list[NewRecord]], Awaitable[list[int]]], producers: int, total: int
) -> tuple[float, list[float], float]:
    """``producers`` tasks append one record at a time.

    Returns (acks/s, ack latencies in ms, this process's CPU µs per append). The CPU figure
    tells contention on a shared machine apart from cost: it moves far less than wall time.
    """
    per = max(1, total // producers)
    latencies: list[float] = []
    # The inputs are built before the clock starts: the figure is the log's, not the test's.
    inputs = [[heartbeat(rank % 1024, i) for i in range(per)] for rank in range(producers)]

    async def produce(rank: int) -> None:
        for rec in inputs[rank]:
            t0 = time.perf_counter()
            await append([rec])
            latencies.append((time.perf_counter() - t0) * 1e3)

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(produce(p) for p in range(producers)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = per * producers
    return n / elapsed, latencies, cpu / n * 1e6


async def group_commit_trial(
    target: str, producers: int, total: int
) -> tuple[float, list[float], float]:
    log = await open_log(target)
    try:
        await log.append([heartbeat(0, -1)])  # warm the connections
        return await drive(log.append, producers, total)
    finally:
        await log.close()


async def naive_sqlite_trial(
    target: str, producers: int, total: int
) -> tuple[float, list[float], float]:
    """The same durability without group commit: each record is its own transaction."""
    log = await open_log(target)  # creates the schema
    await log.close()
    conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    thread = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    next_seq = conn.execute("SELECT next_seq FROM log_head").fetchone()[0]
    state = {"seq": next_seq}

    def write_one(rec: NewRecord) -> list[int]:
        seq = state["seq"]
        data = encode_payload(rec.payload)
        ts = time.time_ns()
        frame, _ = seal(frame_body(seq, ts, 0, rec.kind, rec.group, rec.rank, data))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO log (seq, term, kind, grp, frame) VALUES (?, 0, ?, ?, ?)",
            (seq, rec.kind, rec.group, frame),
        )
        conn.execute("UPDATE log_head SET next_seq = ?", (seq + 1,))
        conn.execute("COMMIT")
        state["seq"] = seq + 1
        return [seq]

    async def append(recs: list[NewRecord]) -> list[int]:
        return await loop.run_in_executor(thread, write_one, recs[0])

    try:
        return await drive(append, producers, total)
    finally:
        thread.shutdown()
        conn.close()


async def naive_postgres_trial(
    target: str, producers: int, total: int
) -> tuple[float, list[float], float]:
    """One autocommitted INSERT per record, serialized on one connection (gap-free offsets)."""
    log = await open_log(target)
    await log.close()
    schema = target.rsplit("schema=", 1)[1]
    conn = await asyncpg.connect(PG_URL, server_settings={"search_path": schema})
    lock = asyncio.Lock()
    insert = (
        "WITH h AS (UPDATE log_head SET next_seq = next_seq + 1 WHERE id = 1 AND next_seq = $1 "
        "RETURNING next_seq - 1 AS seq) "
        "INSERT INTO log (seq, term, kind, grp, frame) "
        "SELECT h.seq, 0, $2, $3, $4 FROM h RETURNING seq"
    )
    state = {"seq": await conn.fetchval("SELECT next_seq FROM log_head")}

    async def append(recs: list[NewRecord]) -> list[int]:
        rec = recs[0]
        data = encode_payload(rec.payload)
        async with lock:
            seq = state["seq"]
            frame, _ = seal(frame_body(seq, time.time_ns(), 0, rec.kind, rec.group, rec.rank, data))
            assert await conn.fetchval(insert, seq, rec.kind, rec.group, frame) == seq
            state["seq"] = seq + 1
            return [seq]

    try:
        return await drive(append, producers, total)
    finally:
        await conn.close()


async def batch_trial(target: str, batch: int, total: int) -> float:
    """One producer appending batches of ``batch`` records: durable records/s."""
    log = await open_log(target)
    try:
        batches = [
            [heartbeat(r % 64, i) for r in range(batch)] for i in range(max(1, total // batch))
        ]
        t0 = time.perf_counter()
        for b in batches:
            await log.append(b)
        return len(batches) * batch / (time.perf_counter() - t0)
    finally:
        await log.close()


# -- many small concurrent appends --------------------------------------------------------------


async def small_batches_trial(
    target: str, callers: int, per: int, rounds: int, openers: int
) -> tuple[float, int, int]:
    """``callers`` tasks each append ``rounds`` batches of ``per`` records.

    With ``openers == 1`` every caller shares one Log, so their appends share commits. With
    ``openers == callers`` each caller has a Log of its own (as separate processes would): every
    Log has its own writer, so nothing is shared and the writers queue on SQLite's write lock.
    Returns (records/s, appends, commits).
    """
    logs = [await open_log(target) for _ in range(openers)]
    try:
        await logs[0].append([heartbeat(0, -1)])  # create the schema and warm up
        warm = sum(log.commits for log in logs)

        async def caller(c: int) -> None:
            log = logs[c % openers]
            for r in range(rounds):
                await log.append([heartbeat(c, r * per + i) for i in range(per)])

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        elapsed = time.perf_counter() - t0
        commits = sum(log.commits for log in logs) - warm
        return callers * per * rounds / elapsed, callers * rounds, commits
    finally:
        for log in logs:
            await log.close()


# -- replay ------------------------------------------------------------------------------------


async def fill(log: Log, n: int) -> None:
    chunk = 5000
    for start in range(0, n, chunk):
        await log.append([heartbeat(i % 64, start + i) for i in range(min(chunk, n - start))])


async def replay(log: Log, page: int = READ_PAGE) -> tuple[int, float, float]:
    """Read the whole log page by page: (records, records/s, records per CPU-second)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    after = count = 0
    while records := await log.read(after, page):
        count += len(records)
        after = records[-1].offset
    return count, count / (time.perf_counter() - t0), count / (time.process_time() - cpu0)


_msgspec_dict = msgspec.json.Decoder(dict).decode


def msgspec_decode(data: bytes) -> Any:
    return _msgspec_dict(data)


async def plain_copy(log: Log, path: str) -> None:
    """The log's records in a plain sqlite3 table, one column per field, for ``naive_replay``."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE log (seq INTEGER PRIMARY KEY, ts_ns INTEGER, term INTEGER, kind TEXT, "
        "grp TEXT, rank INTEGER, payload BLOB, crc INTEGER)"
    )
    after = 0
    while records := await log.read(after, READ_PAGE):
        conn.executemany(
            "INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r.offset,
                    r.ts,
                    r.term,
                    r.kind,
                    r.group,
                    r.rank,
                    encode_payload(r.payload),
                    r.checksum,
                )
                for r in records
            ],
        )
        after = records[-1].offset
    conn.commit()
    conn.close()


def naive_replay(
    path: str, decode: Callable[[bytes], Any] = json.loads, page: int = READ_PAGE
) -> float:
    """Plain sqlite3 reads of ``plain_copy``'s table page by page, each payload decoded by
    ``decode``; nothing else."""
    conn = sqlite3.connect(path)
    t0 = time.perf_counter()
    after = count = 0
    while rows := conn.execute(
        "SELECT seq, ts_ns, term, kind, grp, rank, payload, crc FROM log WHERE seq > ? "
        "ORDER BY seq LIMIT ?",
        (after, page),
    ).fetchall():
        decoded = [(r[0], decode(r[6])) for r in rows]
        count += len(decoded)
        after = rows[-1][0]
    conn.close()
    return count / (time.perf_counter() - t0)


# -- the run -----------------------------------------------------------------------------------


def note(msg: str) -> None:
    print(f"#   {msg}", file=sys.stderr, flush=True)


async def measure(quick: bool) -> list[Result]:
    trials = 1 if quick else 3
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-eventlog-") as tmp:
        targets = Targets(Path(tmp))
        stores = ["sqlite"] + (["postgres"] if await pg_available() else [])
        if "postgres" not in stores:
            note(f"PostgreSQL at {PG_URL} is not reachable: its figures are left out")
        try:
            for store in stores:
                results += await _appends(targets, store, trials, quick)
            results += await _small_batches(targets, quick)
            for store in stores:
                results += await _replays(targets, store, trials, quick)
        finally:
            await targets.drop()
    return results


async def _appends(targets: Targets, store: str, trials: int, quick: bool) -> list[Result]:
    """Durable appends from 1 to 1,000 producers against the naive writer, and batches."""
    totals = {1: 1_000, 10: 4_000, 100: 20_000, 1000: 30_000}
    if not quick:
        totals = {p: n * 3 for p, n in totals.items()}
    naive_total = 1_000 if quick else 3_000
    fresh = targets.sqlite if store == "sqlite" else targets.postgres
    naive = naive_sqlite_trial if store == "sqlite" else naive_postgres_trial
    naive_runs = []
    for _ in range(trials):
        naive_runs.append((await naive(fresh(), 100, naive_total))[0])
        await targets.drop()
    naive_rate = median(naive_runs)
    note(f"{store} naive writer, 100 producers: {naive_rate:,.0f} appends/s")
    results: list[Result] = []
    for producers in PRODUCERS:
        rates, p50s, p99s, cpus = [], [], [], []
        for _ in range(trials):
            rate, lat, cpu = await group_commit_trial(fresh(), producers, totals[producers])
            await targets.drop()
            rates.append(rate)
            cpus.append(cpu)
            p50s.append(percentile(lat, 50))
            p99s.append(percentile(lat, 99))
        note(
            f"{store} {producers} producers: {median(rates):,.0f} appends/s, "
            f"{median(cpus):.1f} client CPU µs per append"
        )
        with_baseline = producers == 100
        results.append(
            Result(
                BENCH,
                f"{store} durable appends, {producers} producers",
                "appends/s",
                median(rates),
                baseline=NAIVE + ", 100 producers" if with_baseline else None,
                baseline_median=naive_rate if with_baseline else None,
                ratio=higher_is_better_ratio(median(rates), naive_rate) if with_baseline else None,
                target=(">=40,000/s and >=20x naive" if store == "sqlite" else None)
                if with_baseline
                else None,
                extra={"client_cpu_us_per_append": round(median(cpus), 1)},
            )
        )
        results.append(
            Result(
                BENCH,
                f"{store} ack latency p50, {producers} producers",
                "ms",
                median(p50s),
                p99=median(p99s),
                target="p99 <= 10 ms" if with_baseline and store == "sqlite" else None,
            )
        )
    for batch in (100, 1000):
        rates = []
        for _ in range(trials):
            rates.append(await batch_trial(fresh(), batch, 20 * batch if quick else 100 * batch))
            await targets.drop()
        note(f"{store} batches of {batch}: {median(rates):,.0f} records/s")
        results.append(
            Result(
                BENCH,
                f"{store} durable appends, 1 producer, batches of {batch}",
                "records/s",
                median(rates),
                target=">=30,000/s" if store == "postgres" else None,
            )
        )
    return results


async def _small_batches(targets: Targets, quick: bool) -> list[Result]:
    """64 callers appending 8 records at a time: one shared Log against one Log each."""
    results = []
    for openers, rounds in ((1, 10 if quick else 40), (64, 1 if quick else 2)):
        rate, appends, commits = await small_batches_trial(targets.sqlite(), 64, 8, rounds, openers)
        await targets.drop()
        shared = "one shared Log" if openers == 1 else "a Log per caller"
        note(
            f"sqlite 64 callers x 8 records, {shared}: {rate:,.0f} records/s, "
            f"{appends} appends in {commits} commits"
        )
        results.append(
            Result(
                BENCH,
                f"sqlite durable appends, 64 callers x 8 records, {shared}",
                "records/s",
                rate,
                extra={"appends": appends, "commits": commits},
            )
        )
    return results


async def _replays(targets: Targets, store: str, trials: int, quick: bool) -> list[Result]:
    """One log of many records, read back page by page (read + verify + decode)."""
    replay_n = 200_000 if quick else 1_000_000
    n = replay_n if store == "sqlite" else replay_n // 5
    target = targets.sqlite() if store == "sqlite" else targets.postgres()
    plain = str(targets.tmp / f"plain-{uuid.uuid4().hex}.db")
    log = await open_log(target)
    try:
        await fill(log, n)
        rates, cpu_rates = [], []
        for _ in range(trials):
            count, rate, cpu_rate = await replay(log)
            assert count == n, f"replay read {count} records, expected {n}"
            rates.append(rate)
            cpu_rates.append(cpu_rate)
        if store == "sqlite":
            await plain_copy(log, plain)
    finally:
        await log.close()
    baseline = floor = None
    if store == "sqlite":
        baseline = median([naive_replay(plain) for _ in range(trials)])
        floor = median([naive_replay(plain, msgspec_decode) for _ in range(trials)])
        os.unlink(plain)
    await targets.drop()
    note(
        f"{store} replay of {n:,}: {median(rates):,.0f} records/s "
        f"({median(cpu_rates):,.0f} per CPU-second)"
    )
    results = [
        Result(
            BENCH,
            f"{store} replay (read + verify + decode), {n:,} records",
            "records/s",
            median(rates),
            baseline="plain sqlite3 table + json.loads, no checksum" if baseline else None,
            baseline_median=baseline,
            ratio=higher_is_better_ratio(median(rates), baseline) if baseline else None,
            target=">=300,000/s" if store == "sqlite" else None,
            extra={"records_per_cpu_second": round(median(cpu_rates))},
        )
    ]
    if floor is not None:
        # the same read with the fastest decoder and nothing else: no checksum, no Record; how
        # close the log's own read path comes to the bare minimum
        results.append(
            Result(
                BENCH,
                f"{store} replay, {n:,} records, against the bare minimum",
                "records/s",
                median(rates),
                baseline="plain sqlite3 table + msgspec, no checksum, no Record",
                baseline_median=floor,
                ratio=higher_is_better_ratio(median(rates), floor),
            )
        )
    return results


def run(quick: bool) -> list[Result]:
    return asyncio.run(measure(quick))
