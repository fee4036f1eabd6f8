"""The store contract: every test here runs against SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio

import pytest

from foldplane.eventlog import (
    MAX_PAYLOAD_BYTES,
    InvalidRecord,
    Log,
    LogClosed,
    LogError,
    NewRecord,
    ProjectionRow,
    RemovedRange,
    StaleTermError,
    open_log,
)
from foldplane.eventlog.record import Encoded, checksum, encode_payload, validate


def hb(rank: int, i: int = 0, group: str = "train") -> NewRecord:
    return NewRecord(kind="heartbeat", group=group, rank=rank, payload={"i": i})


# -- append and read -------------------------------------------------------------------------


async def test_append_returns_gap_free_offsets_from_one(log: Log) -> None:
    assert await log.head() == 0
    assert await log.append([hb(0), hb(1), hb(2)]) == [1, 2, 3]
    assert await log.append([hb(3)]) == [4]
    assert await log.head() == 4


async def test_read_returns_what_was_appended(log: Log) -> None:
    recs = [
        NewRecord(kind="group_created", group="train", payload={"world_size": 4}, ts=17),
        NewRecord(kind="join", group="train", rank=2, payload={"incarnation": "ab", "n": [1, 2]}),
        NewRecord(kind="tick"),
    ]
    offsets = await log.append(recs)
    got = await log.read()
    assert [r.offset for r in got] == offsets
    assert [(r.kind, r.group, r.rank, r.payload) for r in got] == [
        (r.kind, r.group, r.rank, r.payload) for r in recs
    ]
    assert got[0].ts == 17  # a caller's ts is kept
    assert got[1].ts > 17 and got[2].ts == got[1].ts  # missing ts is stamped, once per batch
    assert {r.term for r in got} == {log.term}
    for r in got:
        assert r.checksum == checksum(
            r.offset, r.ts, r.term, r.kind, r.group, r.rank, encode_payload(r.payload)
        )


async def test_append_sealed_gives_the_checksums_the_records_are_stored_with(log: Log) -> None:
    """What the coordinator's host folds without reading it back: offsets and checksums equal
    what a reader gets, for every caller sharing a commit."""
    batches = [[hb(r, i) for r in range(3)] for i in range(4)] + [[NewRecord(kind="tick")]]
    sealed = await asyncio.gather(*(log.append_sealed(b) for b in batches))
    assert await log.append_sealed([]) == ([], [])
    stored = {r.offset: r.checksum for r in await log.read()}
    assert sorted(o for offsets, _ in sealed for o in offsets) == list(range(1, 14))
    for (offsets, checksums), batch in zip(sealed, batches, strict=True):
        assert len(offsets) == len(checksums) == len(batch)
        assert checksums == [stored[o] for o in offsets]


async def test_read_after_is_exclusive_until_is_inclusive_and_limit_pages(log: Log) -> None:
    await log.append([hb(r, i) for i in range(5) for r in range(2)])  # offsets 1..10
    assert [r.offset for r in await log.read(3, limit=4)] == [4, 5, 6, 7]
    assert [r.offset for r in await log.read(3, until=5)] == [4, 5]
    assert await log.read(10) == []
    assert await log.read(5, until=5) == []
    pages, after = [], 0
    while page := await log.read(after, limit=3):
        pages.append([r.offset for r in page])
        after = page[-1].offset
    assert pages == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]


async def test_read_filters_by_group_and_kinds(log: Log) -> None:
    await log.append(
        [
            hb(0, group="a"),
            NewRecord(kind="join", group="b", rank=0),
            hb(1, group="b"),
            NewRecord(kind="tick"),
            NewRecord(kind="join", group="a", rank=1),
        ]
    )
    assert [r.offset for r in await log.read(group="a")] == [1, 5]
    assert [r.offset for r in await log.read(kinds={"join"})] == [2, 5]
    assert [r.offset for r in await log.read(kinds=["join", "tick"])] == [2, 4, 5]
    assert [r.offset for r in await log.read(group="b", kinds=["heartbeat"])] == [3]
    assert await log.read(kinds=[]) == []


async def test_read_refuses_bad_arguments(log: Log) -> None:
    with pytest.raises(ValueError, match="after must be a non-negative integer offset, got -1"):
        await log.read(-1)
    with pytest.raises(ValueError, match="limit must be a positive integer, got 0"):
        await log.read(0, 0)
    with pytest.raises(ValueError, match="kinds must be a collection"):
        await log.read(kinds="join")


@pytest.mark.parametrize("size", [255, 256, 257, 1000, 8192])
async def test_a_large_batch_is_stored_whole_and_in_order(log: Log, size: int) -> None:
    """Batches cross the store's internal statement sizes; every record lands, checksummed."""
    await log.append([hb(0)])
    offsets = await log.append([hb(i % 7, i) for i in range(size)])
    assert offsets == list(range(2, size + 2))
    records = await log.read(1, size + 1)
    assert [r.payload["i"] for r in records] == list(range(size))
    for r in records:
        payload = encode_payload(r.payload)
        assert r.checksum == checksum(r.offset, r.ts, r.term, r.kind, r.group, r.rank, payload)


async def test_concurrent_appends_share_commits(log: Log) -> None:
    before = log.commits
    offsets = await asyncio.gather(*(log.append([hb(i % 8, i)]) for i in range(400)))
    assert sorted(o for batch in offsets for o in batch) == list(range(1, 401))
    # Each append is its own call; group commit must have folded many into one transaction.
    assert log.commits - before < 200


async def test_concurrent_small_batches_share_commits(log: Log) -> None:
    """64 callers appending 8 records at a time, three times each: 192 appends."""
    before = log.commits

    async def caller(c: int) -> list[list[int]]:
        return [await log.append([hb(c, r * 8 + i) for i in range(8)]) for r in range(3)]

    results = await asyncio.gather(*(caller(c) for c in range(64)))
    offsets = [o for per_caller in results for batch in per_caller for o in batch]
    assert sorted(offsets) == list(range(1, 64 * 3 * 8 + 1))
    assert log.commits - before < 96, f"{log.commits - before} commits for 192 appends"


async def test_one_append_is_contiguous_among_concurrent_appends(log: Log) -> None:
    batches = [[hb(j, i) for j in range(1 + i % 5)] for i in range(60)]
    results = await asyncio.gather(*(log.append(b) for b in batches))
    for batch, offsets in zip(batches, results, strict=True):
        assert offsets == list(range(offsets[0], offsets[0] + len(batch)))
        got = await log.read(offsets[0] - 1, until=offsets[-1])
        assert [r.payload for r in got] == [r.payload for r in batch]


# -- bad input: a clear error, nothing written -----------------------------------------------


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            NewRecord(kind="join", payload={"x": object()}),
            r"record 1: payload is not JSON-serializable",
        ),
        (NewRecord(kind="jion"), r"record 1: unknown kind 'jion'"),
        (
            NewRecord(kind="links", payload={"blob": "x" * MAX_PAYLOAD_BYTES}),
            rf"record 1: payload is {MAX_PAYLOAD_BYTES + 11} bytes encoded; the limit is {MAX_PAYLOAD_BYTES}",
        ),
        (
            NewRecord(kind="join", group="no spaces"),
            r"record 1: group 'no spaces' is not a valid name",
        ),
        (NewRecord(kind="join", rank=-2), r"record 1: rank -2 must be a non-negative integer"),
        (NewRecord(kind="join", ts=-5), r"record 1: ts -5 must be non-negative"),
        ({"kind": "join"}, r"record 1: expected a NewRecord, got dict"),
        # what a column cannot hold is refused up front, never by the store mid-batch
        (
            NewRecord(kind="join", rank=2**31),
            r"record 1: rank 2147483648 must be .* up to 2147483647",
        ),
        (NewRecord(kind="join", ts=2**63), r"record 1: ts 9223372036854775808 must be"),
        (NewRecord(kind=["join"]), r"record 1: unknown kind \['join'\]"),  # type: ignore[arg-type]
        (
            NewRecord(kind="join", group="train\n"),
            r"record 1: group 'train\\n' is not a valid name",
        ),
        # refused after the same group was accepted, so a remembered good name lets nothing by
        (NewRecord(kind="join", group="train", rank=True), r"record 1: rank True must be"),
        (NewRecord(kind="join", group="train", ts=1.5), r"record 1: ts 1.5 must be"),  # type: ignore[arg-type]
        (NewRecord(kind="join", group=7), r"record 1: group 7 is not a valid name"),  # type: ignore[arg-type]
    ],
)
async def test_bad_record_refuses_the_whole_batch(log: Log, bad: object, message: str) -> None:
    await log.append([hb(0)])
    with pytest.raises(InvalidRecord, match=message):
        await log.append([hb(1), bad, hb(2)])  # type: ignore[list-item]
    assert await log.head() == 1
    assert [r.rank for r in await log.read()] == [0]
    assert await log.append([hb(3)]) == [2]  # the log goes on, gap-free


async def test_an_encoded_record_is_stored_with_its_bytes_and_its_fields_still_checked(
    log: Log,
) -> None:
    rec = hb(0, 7)
    assert await log.append([Encoded(rec, validate(rec))]) == [1]
    (back,) = await log.read()
    assert back.payload == {"i": 7}
    assert back.checksum == checksum(1, back.ts, back.term, "heartbeat", "train", 0, b'{"i":7}')
    for bad, message in [
        (Encoded(NewRecord(kind="jion"), b"{}"), r"record 1: unknown kind 'jion'"),
        (Encoded(hb(1), "{}"), r"record 1: an Encoded payload must be"),  # type: ignore[arg-type]
        (Encoded({"kind": "join"}, b"{}"), r"record 1: expected a NewRecord, got dict"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidRecord, match=message):
            await log.append([hb(2), bad])
    assert await log.head() == 1  # nothing of the refused batches was written


async def test_append_of_a_single_record_not_in_a_list_is_refused(log: Log) -> None:
    with pytest.raises(InvalidRecord, match="sequence of NewRecord"):
        await log.append(hb(0))  # type: ignore[arg-type]
    assert await log.head() == 0


async def test_empty_append_writes_nothing(log: Log) -> None:
    assert await log.append([]) == []
    assert await log.head() == 0


# -- waiting and tailing ---------------------------------------------------------------------


async def test_wait_returns_at_once_when_head_is_past(log: Log) -> None:
    await log.append([hb(0), hb(1)])
    assert await log.wait(1) == 2


async def test_wait_times_out_with_the_current_head(log: Log) -> None:
    await log.append([hb(0)])
    assert await log.wait(1, timeout=0.05) == 1


async def test_wait_is_woken_by_an_append(log: Log) -> None:
    waiter = asyncio.create_task(log.wait(0))
    await asyncio.sleep(0)  # let it start waiting
    assert not waiter.done()
    await log.append([hb(0)])
    assert await asyncio.wait_for(waiter, 10) == 1


async def test_tail_yields_old_then_new_records(log: Log) -> None:
    await log.append([hb(0, 0), hb(1, 0)])
    seen: list[int] = []
    got_three = asyncio.Event()

    async def follow() -> None:
        async for rec in log.tail(0, batch=2):
            seen.append(rec.offset)
            if len(seen) == 5:
                got_three.set()

    task = asyncio.create_task(follow())
    await log.append([hb(2, 0)])
    await log.append([hb(3, 0), hb(4, 0)])
    await asyncio.wait_for(got_three.wait(), 10)
    assert seen == [1, 2, 3, 4, 5]
    task.cancel()


async def test_tail_with_a_filter_skips_past_hidden_records(log: Log) -> None:
    await log.append([hb(0), NewRecord(kind="tick"), hb(1)])
    seen: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def follow() -> None:
        async for rec in log.tail(1, kinds=["tick", "exit"], batch=1):
            seen.append((rec.offset, rec.kind))
            if rec.kind == "exit":
                done.set()

    task = asyncio.create_task(follow())
    await log.append([hb(2), hb(3), NewRecord(kind="exit", group="train", rank=3)])
    await asyncio.wait_for(done.wait(), 10)
    assert seen == [(2, "tick"), (6, "exit")]
    task.cancel()


async def test_tail_ends_when_the_log_is_closed(target: str) -> None:
    log = await open_log(target)
    await log.append([hb(0)])
    seen: list[int] = []
    got_one = asyncio.Event()

    async def follow() -> None:
        async for rec in log.tail():
            seen.append(rec.offset)
            got_one.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(got_one.wait(), 10)
    await log.close()
    await asyncio.wait_for(task, 10)  # returns, no exception
    assert seen == [1]


async def test_appends_from_another_log_wake_waiters(log: Log, target: str) -> None:
    other = await open_log(target)
    try:
        waiter = asyncio.create_task(log.wait(0, timeout=30))
        await asyncio.sleep(0)
        await other.append([hb(0)])
        assert await waiter == 1
        assert [r.rank for r in await log.read()] == [0]
    finally:
        await other.close()


# -- fencing ---------------------------------------------------------------------------------


async def test_claimed_term_fences_the_old_writer(log: Log, target: str) -> None:
    assert await log.append([hb(0)]) == [1]
    old_term = log.term
    leader = await open_log(target)
    try:
        new_term = await leader.claim_term()
        assert new_term == old_term + 1 == leader.term
        with pytest.raises(
            StaleTermError, match=rf"holds term {old_term} but the log's head is at term {new_term}"
        ):
            await log.append([hb(1), hb(2)])
        assert await leader.append([hb(3)]) == [2]
        got = await leader.read()
        assert [(r.offset, r.rank, r.term) for r in got] == [(1, 0, old_term), (2, 3, new_term)]
    finally:
        await leader.close()


async def test_a_writer_that_claims_again_appends_again(log: Log, target: str) -> None:
    other = await open_log(target)
    try:
        await other.claim_term()
        with pytest.raises(StaleTermError):
            await log.append([hb(0)])
        await log.claim_term()
        assert await log.append([hb(1)]) == [1]
        with pytest.raises(StaleTermError):
            await other.append([hb(2)])
    finally:
        await other.close()


async def test_two_writers_under_one_term_stay_gap_free(log: Log, target: str) -> None:
    other = await open_log(target)
    try:
        assert other.term == log.term
        results = await asyncio.gather(
            *(w.append([hb(i, j)]) for j in range(30) for i, w in enumerate((log, other)))
        )
        assert sorted(o for r in results for o in r) == list(range(1, 61))
        assert [r.offset for r in await log.read(limit=100)] == list(range(1, 61))
    finally:
        await other.close()


async def test_many_logs_on_one_store_take_turns(log: Log, target: str) -> None:
    """16 openers appending 8 records twice each, at once: every append lands contiguous."""
    others = [await open_log(target) for _ in range(15)]
    try:
        writers = [log, *others]

        async def caller(i: int, w: Log) -> list[list[int]]:
            return [await w.append([hb(i, r * 8 + j) for j in range(8)]) for r in range(2)]

        results = await asyncio.gather(*(caller(i, w) for i, w in enumerate(writers)))
        batches = [batch for per_writer in results for batch in per_writer]
        assert all(b == list(range(b[0], b[0] + 8)) for b in batches)
        assert sorted(o for b in batches for o in b) == list(range(1, 16 * 2 * 8 + 1))
        await log.set_consumer_offset("fold", 256)  # other writes take their turn too
        assert await others[-1].get_consumer_offset("fold") == 256
    finally:
        for w in others:
            await w.close()


# -- consumers, projections, snapshots -------------------------------------------------------


async def test_consumer_offsets_are_named_and_monotone(log: Log) -> None:
    assert await log.get_consumer_offset("fold") == 0
    await log.set_consumer_offset("fold", 5)
    await log.set_consumer_offset("fold", 5)  # the same value again is fine
    await log.set_consumer_offset("audit", 2)
    assert await log.get_consumer_offset("fold") == 5
    with pytest.raises(
        ValueError, match="consumer 'fold' .* is at offset 5; refusing to move it back to 4"
    ):
        await log.set_consumer_offset("fold", 4)
    assert await log.get_consumer_offset("fold") == 5
    assert await log.get_consumer_offset("audit") == 2


async def test_projections_upsert_with_their_consumer_offset(log: Log) -> None:
    v1 = ProjectionRow("view", "train", 1, {"active_ranks": [0, 1]})
    v2 = ProjectionRow("view", "train", 2, {"active_ranks": [0]})
    other = ProjectionRow("view", "eval", 1, {"active_ranks": [3]})
    await log.write_projections([v1, v2, other], consumer="fold", offset=7)
    assert await log.get_consumer_offset("fold") == 7
    assert await log.read_projections("view") == [other, v1, v2]  # by (group, seq)
    assert await log.read_projections("view", "train", after_seq=1) == [v2]
    assert await log.read_projections("view", limit=1) == [other]
    assert await log.read_projections("proposal") == []
    fixed = ProjectionRow("view", "train", 2, {"active_ranks": [0, 1, 2]})
    await log.write_projections([fixed], consumer="fold", offset=9)
    assert await log.get_projection("view", "train", 2) == fixed
    assert await log.get_projection("view", "train", 3) is None


async def test_a_write_not_durable_is_seen_and_refused_like_a_durable_one(
    log: Log, target: str
) -> None:
    """``durable=False`` changes only when the write reaches the disk: another opener sees it at
    once, it moves the offset with its rows, a lower offset is still refused with no row
    written, and appends go on after it."""
    row = ProjectionRow("view", "train", 1, {"active_ranks": [0, 1]})
    await log.write_projections([row], consumer="fold", offset=3, durable=False)
    other = await open_log(target)
    try:
        assert await other.get_projection("view", "train", 1) == row
        assert await other.get_consumer_offset("fold") == 3
    finally:
        await other.close()
    late = ProjectionRow("view", "train", 2, {"active_ranks": [0]})
    with pytest.raises(ValueError, match="refusing to move it back to 2"):
        await log.write_projections([late], consumer="fold", offset=2, durable=False)
    assert await log.get_projection("view", "train", 2) is None
    [offset] = await log.append([NewRecord(kind="heartbeat", group="g", rank=0, payload={})])
    assert await log.read(offset - 1, limit=1) != []


async def test_a_projection_given_twice_in_one_write_keeps_the_last(log: Log) -> None:
    first = ProjectionRow("view", "train", 1, {"v": 1})
    again = ProjectionRow("view", "train", 1, {"v": 2})
    await log.write_projections([first, again], consumer="fold", offset=4)
    assert await log.read_projections("view") == [again]
    await log.write_projections([], consumer="fold", offset=6)  # no rows: the offset still moves
    assert await log.get_consumer_offset("fold") == 6


async def test_projections_and_offset_are_refused_together(log: Log) -> None:
    first = ProjectionRow("view", "train", 1, {"v": 1})
    await log.write_projections([first], consumer="fold", offset=5)
    late = ProjectionRow("view", "train", 1, {"v": "stale"})
    with pytest.raises(ValueError, match="refusing to move it back to 3"):
        await log.write_projections([late], consumer="fold", offset=3)
    assert await log.get_projection("view", "train", 1) == first
    with pytest.raises(InvalidRecord, match=r"projection 1: doc is not JSON-serializable"):
        await log.write_projections(
            [
                ProjectionRow("view", "train", 2, {}),
                ProjectionRow("view", "train", 3, {"x": object()}),
            ],
            consumer="fold",
            offset=8,
        )
    assert await log.get_consumer_offset("fold") == 5
    assert await log.read_projections("view") == [first]


async def test_snapshots_keep_the_latest_per_name(log: Log) -> None:
    assert await log.load_snapshot("fold") is None
    await log.save_snapshot("fold", 10, b"\x00state-at-10")
    await log.save_snapshot("fold", 20, b"state-at-20")
    await log.save_snapshot("other", 3, b"")
    assert await log.load_snapshot("fold") == (20, b"state-at-20")
    assert await log.load_snapshot("other") == (3, b"")


# -- lifecycle -------------------------------------------------------------------------------


async def test_records_survive_reopening(target: str) -> None:
    log = await open_log(target)
    await log.append([hb(0, 1), hb(1, 2)])
    await log.set_consumer_offset("fold", 2)
    await log.close()
    log = await open_log(target, create=False)
    try:
        assert await log.head() == 2
        assert [r.payload for r in await log.read()] == [{"i": 1}, {"i": 2}]
        assert await log.get_consumer_offset("fold") == 2
        assert await log.append([hb(2)]) == [3]
    finally:
        await log.close()


async def test_a_closed_log_refuses_calls(target: str) -> None:
    log = await open_log(target)
    await log.close()
    await log.close()  # idempotent
    with pytest.raises(LogClosed, match="is closed"):
        await log.append([hb(0)])
    with pytest.raises(LogClosed):
        await log.read()


async def test_closing_wakes_waiters_with_log_closed(target: str) -> None:
    log = await open_log(target)
    waiter = asyncio.create_task(log.wait(0))
    while not log._waiting and not waiter.done():  # until it waits (a close before is another case)
        await asyncio.sleep(0)
    await log.close()
    with pytest.raises(LogClosed):
        await asyncio.wait_for(waiter, 10)


async def test_create_false_refuses_a_missing_log(fresh_target: str) -> None:
    with pytest.raises(LogError, match="does not exist"):
        await open_log(fresh_target, create=False)


@pytest.mark.postgres
async def test_postgres_writer_recovers_from_a_lost_connection(pg_url: str, pg_schema: str) -> None:
    import asyncpg

    from tests.eventlog.conftest import schema_url

    log = await open_log(schema_url(pg_url, pg_schema))
    try:
        assert await log.append([hb(0)]) == [1]
        admin = await asyncpg.connect(pg_url)
        try:
            pid = log._conn.get_server_pid()  # the writer's backend
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        try:
            await log.append([hb(1)])
        except LogError as exc:  # the batch that met the dead connection fails, by name
            assert "append of 1 records" in str(exc)
        assert (await log.append([hb(2)]))[0] in (2, 3)
        assert [r.offset for r in await log.read()] == list(range(1, await log.head() + 1))
    finally:
        await log.close()


async def test_sqlite_writer_survives_a_failing_write(tmp_path, monkeypatch) -> None:
    """A write that blows up fails its own callers; the writer thread lives on."""
    from foldplane.eventlog import sqlite_writer

    log = await open_log(tmp_path / "log.db")
    try:
        real = sqlite_writer._insert_rows
        calls = {"n": 0}

        def failing_once(*args):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("disk on fire")
            return real(*args)

        # fails inside the transaction, after BEGIN and the head read, before any row
        monkeypatch.setattr(sqlite_writer, "_insert_rows", failing_once)
        with pytest.raises(LogError, match="disk on fire"):
            await log.append([hb(0)])
        assert await log.append([hb(1)]) == [1]  # nothing of the failed batch was written
        assert [r.rank for r in await log.read()] == [1]
    finally:
        await log.close()


async def test_sqlite_a_write_not_durable_leaves_the_next_commits_synced(tmp_path) -> None:
    """A projection write without its own fsync (``synchronous=NORMAL`` for that one
    transaction) leaves the writer's connection at FULL again, after a refused write too, so
    every append after it is synced before it is acknowledged."""
    log = await open_log(tmp_path / "log.db")

    async def synchronous() -> int:  # 2 is FULL, 1 NORMAL (asked inside a writer transaction)
        return await log._write(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])

    try:
        assert await synchronous() == 2
        await log.write_projections(
            [ProjectionRow("view", "train", 1, {})], consumer="fold", offset=5, durable=False
        )
        assert await synchronous() == 2
        with pytest.raises(ValueError, match="refusing to move it back"):
            await log.write_projections([], consumer="fold", offset=1, durable=False)
        assert await synchronous() == 2
        inside = await log._write(  # and the write itself ran at NORMAL
            lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0], durable=False
        )
        assert inside == 1
        assert await synchronous() == 2
    finally:
        await log.close()


async def test_sqlite_inserts_fit_an_old_sqlites_parameter_limit(tmp_path, monkeypatch) -> None:
    """SQLite before 3.32 allows 999 parameters a statement: batches still go in whole."""
    import sqlite3

    from foldplane.eventlog import sqlite_writer

    real = sqlite_writer.connect_writer

    def old_sqlite(path):
        conn = real(path)
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        return conn

    monkeypatch.setattr(sqlite_writer, "connect_writer", old_sqlite)
    log = await open_log(tmp_path / "log.db")
    try:
        assert await log.append([hb(i % 7, i) for i in range(1000)]) == list(range(1, 1001))
        assert [r.payload["i"] for r in await log.read(0, 2000)] == list(range(1000))
    finally:
        await log.close()


# -- retention: compaction steps behind a kept snapshot --------------------------------------


async def test_a_compaction_step_removes_records_behind_a_kept_snapshot(log: Log) -> None:
    """The removed offsets are gone, the kept ones stay, the range says what went, and offsets
    are never reused: the next append continues after the head."""
    await log.append([hb(r % 2, r) for r in range(10)])  # offsets 1..10
    removed = await log.compact("fold", 8, b"state at 8", [2, 3, 5, 7])
    assert removed == RemovedRange(2, 7, 4)
    assert [r.offset for r in await log.read()] == [1, 4, 6, 8, 9, 10]
    assert await log.removed_ranges() == [removed]
    assert await log.kept_snapshots("fold") == [8]
    assert await log.load_kept_snapshot("fold", 8) == b"state at 8"
    assert await log.load_kept_snapshot("fold", 7) is None
    assert await log.head() == 10
    assert await log.append([hb(0)]) == [11]
    # a step with nothing to remove still keeps its snapshot, and records no range
    assert await log.compact("fold", 10, b"state at 10", []) is None
    assert await log.kept_snapshots("fold") == [8, 10]
    assert await log.removed_ranges() == [removed]
    # a newer step may shrink the snapshot it supersedes to a summary, in its transaction
    await log.compact("fold", 11, b"state at 11", [], previous=b"summary of 10")
    assert await log.load_kept_snapshot("fold", 10) == b"summary of 10"
    assert await log.load_kept_snapshot("fold", 8) == b"state at 8"
    assert await log.load_kept_snapshot("fold", 11) == b"state at 11"


async def test_removed_ranges_are_found_by_the_span_a_reader_reads(log: Log) -> None:
    await log.append([hb(0, i) for i in range(30)])
    first = await log.compact("fold", 10, b"a", [2, 3, 4])
    second = await log.compact("fold", 20, b"b", [12, 15, 19])
    assert await log.removed_ranges() == [first, second]
    assert await log.removed_ranges(after=4) == [second]  # 2..4 lies at or before 4
    assert await log.removed_ranges(after=3) == [first, second]
    assert await log.removed_ranges(after=0, until=11) == [first]
    assert await log.removed_ranges(after=0, until=12) == [first, second]
    assert await log.removed_ranges(after=19) == []
    assert await log.removed_ranges(after=5, until=5) == []


async def test_compaction_refuses_what_would_leave_an_unfoldable_log(log: Log) -> None:
    """Each refusal names the rule and changes nothing."""
    await log.append([hb(0, i) for i in range(20)])
    await log.compact("fold", 10, b"a", [3, 4])
    refusals = [
        (("fold", 25, b"x", []), "its head is 20"),
        (("fold", 10, b"x", []), "already keeps snapshot 'fold' at offset 10"),
        (("fold", 9, b"x", []), "already keeps snapshot 'fold' at offset 10"),
        (("fold", 15, b"x", [9, 12]), "lies at or before offset 10"),
        (("fold", 15, b"x", [12, 16]), "lies after the kept snapshot at offset 15"),
        (("fold", 15, b"x", [13, 12]), "strictly increasing"),
        (("other", 15, b"x", [4, 12]), "lies at or before offset 4"),  # a removed range
        (("fold", 15, b"x", [12, 3]), "strictly increasing"),
    ]
    for args, why in refusals:
        with pytest.raises(ValueError, match=why):
            await log.compact(*args)
    await log.compact("fold", 15, b"b", [12, 13])
    assert [r.offset for r in await log.read(after=10)] == [11, 14, 15, 16, 17, 18, 19, 20]
    assert await log.load_kept_snapshot("fold", 15) == b"b"
    assert await log.removed_ranges() == [RemovedRange(3, 4, 2), RemovedRange(12, 13, 2)]
    assert await log.kept_snapshots("fold") == [10, 15]


async def test_stored_bytes_counts_what_the_store_holds(log: Log) -> None:
    empty = await log.stored_bytes()
    assert empty > 0
    await log.append([hb(0, i) for i in range(2000)])
    assert await log.stored_bytes() > empty
