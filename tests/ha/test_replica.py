"""The replica role in-process on the real PostgreSQL: standby answers, handover, projection holes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import pytest

from foldplane.coordinator.host.leadership import LeaseSettings
from foldplane.coordinator.host.loop import CONSUMER, Appended, Host, HostUnavailable
from foldplane.coordinator.host.replica import NotLeader, Replica, open_host, open_replica
from foldplane.eventlog import NewRecord, StaleTermError, open_log
from foldplane.eventlog.projection import ProjectionRow
from tests.ha.cluster import ROOT, drop_schema, new_schema, schema_url

pytestmark = pytest.mark.postgres

FAST = LeaseSettings(lease_s=1.0, poll_s=0.05)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    schema = new_schema()
    yield schema_url(schema)
    await drop_schema(schema)


async def until(predicate: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    """Until ``predicate`` holds. The hosts' roles and what a standby has folded move with
    PostgreSQL (its lease, its notifications and the log the standby reads), which tells this
    test nothing: this looks every 20 ms, and fails after ``timeout`` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def group_created(group: str) -> NewRecord:
    return NewRecord(kind="group_created", group=group, payload={"world_size": 2, "config": {}})


async def replica(url: str, name: str) -> Host:
    host = await open_host(url, address=f"http://{name}:8470", settings=FAST)
    assert isinstance(host.role, Replica)
    return host


async def test_standby_follows_refuses_writes_and_takes_over_on_release(url: str) -> None:
    a = await replica(url, "a")
    await until(lambda: a.role.name == "leader", "a to lead")
    b = await replica(url, "b")
    try:
        await until(lambda: b.role.leader == "http://a:8470", "b to learn the leader")
        assert b.role.name == "standby"
        with pytest.raises(NotLeader) as caught:
            await b.submit(group_created("on-b"))
        assert caught.value.leader == "http://a:8470"
        assert "the leader is http://a:8470" in caught.value.detail
        with pytest.raises(NotLeader):
            await b.updates("g", 0, 0, timeout=0)

        created = await a.submit(group_created("g"))
        assert isinstance(created, Appended)
        await until(lambda: b.machine.group_config("g") is not None, "b to fold the group")
        assert b.machine.offset == a.machine.offset  # the same fold, warm

        await a.close()  # a graceful stop releases the lease: no wait for it to run out
        await until(lambda: b.role.name == "leader", "b to lead")
        assert isinstance(await b.submit(group_created("h")), Appended)
        records = await b.log.read(0)
        assert [(r.group, r.term) for r in records] == [("g", 1), ("h", 2)]
        assert await b.log.get_projection("group", "h", 0) is not None
    finally:
        await a.close()
        await b.close()


async def test_new_leader_writes_the_projections_its_predecessor_did_not(url: str) -> None:
    # A leader appended, then died before it wrote the projection rows of what it appended.
    log = await open_log(url)
    await log.claim_term()
    assert await log.append([group_created("g")]) == [1]
    assert await log.get_projection("group", "g", 0) is None
    await log.close()

    host = await replica(url, "next")
    try:
        await until(lambda: host.role.name == "leader", "the standby to lead")
        assert await host.log.get_projection("group", "g", 0) is not None
        assert await host.log.get_consumer_offset(CONSUMER) == 1
    finally:
        await host.close()


async def test_leader_fenced_by_a_newer_term_steps_down_and_writes_nothing(url: str) -> None:
    a = await replica(url, "a")
    rogue = await open_log(url)
    try:
        await until(lambda: a.role.name == "leader", "a to lead")
        assert isinstance(await a.submit(group_created("g")), Appended)
        taken = await rogue.claim_term()  # another writer took the log without the lease
        with pytest.raises(HostUnavailable) as caught:
            await a.submit(group_created("lost"))
        assert caught.value.code == "not_leader"
        assert f"the log's head is at term {taken}" in caught.value.detail
        # It steps down, then (the lease being its own and free) leads again at a new term.
        await until(lambda: a.role.name == "leader" and a.log.term > taken, "a to lead again")
        assert isinstance(await a.submit(group_created("h")), Appended)
        records = await a.log.read(0)
        assert [r.group for r in records] == ["g", "h"]
        assert records[1].term > taken
        assert Replica.of(a).demotions == 1 and Replica.of(a).promotions == 2
    finally:
        await rogue.close()
        await a.close()


async def test_a_leader_behind_the_log_sends_no_reader_back_as_if_the_log_were_restored(
    url: str,
) -> None:
    """Another writer appended past this leader's fold (it led while this one was paused, and
    this one has not noticed yet): a reader that resumes after such an offset gets not_leader,
    not a resync from the stale fold marked restored, which would make its agent drop its
    view for an older one. A reader past the log's own head is still told the log was
    restored, and one within the fold is answered as before."""
    a = await replica(url, "a")
    rogue = await open_log(url)
    try:
        await until(lambda: a.role.name == "leader", "a to lead")
        assert isinstance(await a.submit(group_created("g")), Appended)
        folded = a.machine.offset
        await rogue.claim_term()
        ahead = (await rogue.append([group_created("x"), group_created("y")]))[-1]
        assert a.role.name == "leader" and a.machine.offset == folded  # it has not noticed
        with pytest.raises(HostUnavailable) as caught:
            await a.updates("g", (0,), ahead, timeout=0)
        assert caught.value.code == "not_leader"
        assert f"ends at offset {folded}, before offset {ahead}" in caught.value.detail
        past = await a.updates("g", (0,), ahead + 1, timeout=0)  # past the log's head itself
        assert past.resync and past.restored
        within = await a.updates("g", (0,), folded, timeout=0)
        assert not within.restored
    finally:
        await rogue.close()
        await a.close()


async def test_a_deposed_writer_writes_no_projection_offset_or_snapshot(url: str) -> None:
    """Every write of a leader besides the append is fenced by its term too: once another
    writer claimed the log, the old one's projection rows, consumer offset and snapshot are
    refused with StaleTermError and nothing of them reaches the tables."""
    old = await open_log(url)
    new = await open_log(url)
    try:
        term = await old.claim_term()
        (offset,) = await old.append([group_created("g")])
        row = ProjectionRow(kind="group", group="g", seq=1, doc={"v": 1})
        await old.write_projections([row], consumer=CONSUMER, offset=offset)
        await old.save_snapshot(CONSUMER, offset, b"state at 1")
        taken = await new.claim_term()
        assert taken == term + 1
        stale = ProjectionRow(kind="group", group="g", seq=1, doc={"v": 2})
        with pytest.raises(StaleTermError):
            await old.write_projections([stale], consumer=CONSUMER, offset=offset + 1)
        with pytest.raises(StaleTermError):
            await old.set_consumer_offset(CONSUMER, offset + 1)
        with pytest.raises(StaleTermError):
            await old.save_snapshot(CONSUMER, offset + 1, b"stale state")
        assert [r.doc for r in await new.read_projections("group", "g")] == [{"v": 1}]
        assert await new.get_consumer_offset(CONSUMER) == offset
        assert await new.load_snapshot(CONSUMER) == (offset, b"state at 1")
        # The new term's writer is not fenced.
        await new.write_projections([stale], consumer=CONSUMER, offset=offset + 1)
        await new.save_snapshot(CONSUMER, offset + 1, b"new state")
        assert await new.load_snapshot(CONSUMER) == (offset + 1, b"new state")
    finally:
        await old.close()
        await new.close()


async def test_a_sqlite_log_has_one_coordinator(tmp_path) -> None:
    db = str(tmp_path / "log.db")
    with pytest.raises(ValueError) as caught:
        await open_replica(db, address="http://a:8470", settings=FAST)
    assert "has one coordinator; standbys need a PostgreSQL log" in str(caught.value)
    host = await open_host(db, address="http://a:8470", settings=FAST)
    try:
        assert not isinstance(host.role, Replica)
        assert isinstance(await host.submit(group_created("g")), Appended)
    finally:
        await host.close()


def test_serve_refuses_lease_settings_that_cannot_work(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "serve", "--db", str(tmp_path / "log.db")]
        + ["--lease-s", "1", "--lease-poll-s", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--lease-s/--lease-poll-s: poll_s (2.0 s) must be shorter than lease_s" in done.stderr
    assert not (tmp_path / "log.db").exists()  # refused before anything was opened
