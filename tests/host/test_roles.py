"""A host's role (coordinator/host/loop.py): a SQLite log's coordinator is its sole leader."""

from __future__ import annotations

import pytest

from foldplane.coordinator.host.leadership import LeaseSettings
from foldplane.coordinator.host.loop import Appended, Host, SoleLeader
from foldplane.coordinator.host.replica import Replica, open_host, open_replica
from foldplane.eventlog import NewRecord


async def test_a_sqlite_log_is_served_by_its_sole_leader_at_once(tmp_path) -> None:
    host = await open_host(str(tmp_path / "log.db"), address="http://a:8470")
    try:
        assert isinstance(host.role, SoleLeader)
        assert host.role.name == "leader" and host.role.leader is None
        created = await host.submit(
            NewRecord(kind="group_created", group="g", payload={"world_size": 1, "config": {}})
        )
        assert isinstance(created, Appended)
        answer = await host.updates("g", [0], 0, timeout=0)  # a leader answers long polls
        assert answer.next_after == host.applied_offset
    finally:
        await host.close()


async def test_standbys_need_a_postgresql_log(tmp_path) -> None:
    with pytest.raises(ValueError, match="has one coordinator; standbys need a PostgreSQL log"):
        await open_replica(
            str(tmp_path / "log.db"), address="http://a:8470", settings=LeaseSettings()
        )
    host = await Host.open(str(tmp_path / "log.db"))
    try:
        with pytest.raises(TypeError, match="role is SoleLeader; open it with open_replica"):
            Replica.of(host)
    finally:
        await host.close()
