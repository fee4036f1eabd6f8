"""What ``open_log`` accepts as a target, and the errors for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from foldplane.eventlog import LogError
from foldplane.eventlog.target import PostgresTarget, SqliteTarget, parse_target


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("log.db", "log.db"),
        ("/var/lib/fp/log.db", "/var/lib/fp/log.db"),
        ("sqlite:///rel/log.db", "rel/log.db"),
        ("sqlite:////abs/log.db", "/abs/log.db"),
        (Path("p.db"), "p.db"),
    ],
)
def test_sqlite_targets(given: str | Path, path: str) -> None:
    assert parse_target(given) == SqliteTarget(Path(path))


def test_postgres_target_takes_the_schema_out_of_the_url() -> None:
    got = parse_target("postgresql://u@127.0.0.1:5432/db?schema=fp_1&connect_timeout=5")
    assert got == PostgresTarget("postgresql://u@127.0.0.1:5432/db?connect_timeout=5", "fp_1")
    assert got.describe() == "PostgreSQL log 127.0.0.1:5432/db schema 'fp_1'"
    assert parse_target("postgres://h/db") == PostgresTarget("postgresql://h/db", None)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("sqlite:///:memory:", "must name a file"),
        ("sqlite://", "must look like sqlite:///path"),
        ("mysql://h/db", "has scheme 'mysql'"),
        ("postgresql://h/db?schema=Robert'); DROP", "must be a lower-case SQL identifier"),
        ("", "must be a path or a URL"),
    ],
)
def test_bad_targets_are_named(given: str, message: str) -> None:
    with pytest.raises(LogError, match=message):
        parse_target(given)
