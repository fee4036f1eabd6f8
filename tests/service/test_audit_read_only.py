"""Audits never write: ``replay`` and ``explain`` open the log read-only, refuse a file that is
not a foldplane log naming what it is, and say how many records they read (real files, the
real command line)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.conftest import ROOT, replay


def explain(db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "explain", str(db), "--group", "g", "--rank", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def snapshot_dir(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_foreign_sqlite_database_is_refused_and_left_byte_identical(tmp_path: Path):
    other = tmp_path / "app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = snapshot_dir(tmp_path)
    for run in (replay(other), explain(other)):
        assert run.returncode == 2, run
        assert "is not a foldplane log: a SQLite database with tables [users]" in run.stderr, run
    assert snapshot_dir(tmp_path) == before  # the same files, byte for byte


def test_an_empty_file_and_a_text_file_are_refused_naming_what_they_are(tmp_path: Path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    text = tmp_path / "notes.db"
    text.write_text("hello, not a database")
    before = snapshot_dir(tmp_path)
    run = replay(empty)
    assert run.returncode == 2 and "is an empty file, not a foldplane log" in run.stderr, run
    run = replay(text)
    assert run.returncode == 2 and "not a SQLite database (it starts with b'hello" in run.stderr
    assert snapshot_dir(tmp_path) == before


def test_a_log_replays_read_only_saying_how_many_records_it_read(tmp_path: Path):
    import asyncio

    from foldplane.eventlog import NewRecord, open_log

    db = tmp_path / "log.db"

    async def write() -> None:
        log = await open_log(db)
        await log.append([NewRecord(kind="group_created", group="g",
                                    payload={"world_size": 1, "config": {}})])  # fmt: skip
        await log.close()

    asyncio.run(write())
    before = snapshot_dir(tmp_path)
    run = replay(db)
    assert "replay: read 1 records of" in run.stderr, run
    assert snapshot_dir(tmp_path) == before  # not even a -wal or -shm file appears


def test_an_empty_log_is_replayed_with_a_warning(tmp_path: Path):
    import asyncio

    from foldplane.eventlog import open_log

    db = tmp_path / "log.db"

    async def create() -> None:
        await (await open_log(db)).close()

    asyncio.run(create())
    run = replay(db)
    assert "holds no records" in run.stderr and f"no {db}-wal beside it" in run.stderr, run


def test_plot_without_matplotlib_is_refused_before_the_replay(tmp_path: Path):
    db = tmp_path / "missing.db"  # the replay would refuse this: the plot's check comes first
    hide = (
        "import sys; sys.modules['matplotlib'] = None; "
        "from foldplane.cli import main; raise SystemExit(main(sys.argv[1:]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", hide, "replay", str(db), "--plot", str(tmp_path / "t.png")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run
    assert "--plot: matplotlib is not installed" in run.stderr, run.stderr
    assert "does not exist" not in run.stderr, run.stderr


def test_compact_and_serve_refuse_a_foreign_sqlite_database_and_an_empty_file(
    tmp_path: Path, capsys
):
    """The commands that write (``compact``, ``serve``) check what they open too, before
    anything is written: an application's database and an empty file stay byte-identical."""
    from foldplane.cli import main
    from tests.conftest import free_port

    other = tmp_path / "app.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    before = snapshot_dir(tmp_path)
    port = str(free_port())
    for args in (["compact", str(other)], ["serve", "--db", str(other), "--port", port]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "is not a foldplane log: a SQLite database with tables [users]" in err, err
    assert main(["compact", str(empty)]) == 2
    assert "is an empty file, not a foldplane log" in capsys.readouterr().err
    assert main(["serve", "--db", str(empty), "--port", port]) == 2
    err = capsys.readouterr().err
    assert "is an empty file" in err and "only where no file is" in err and "--init-empty" in err
    assert snapshot_dir(tmp_path) == before  # the same files, byte for byte


async def test_a_new_log_is_made_in_an_empty_file_only_when_asked(tmp_path: Path):
    """The twin: ``--init-empty`` (``adopt_empty``) makes the log in an empty file; a path
    that does not exist gets one without asking."""
    from foldplane.eventlog import NewRecord, open_log

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for path, options in ((empty, {"adopt_empty": True}), (tmp_path / "new.db", {})):
        log = await open_log(path, **options)
        try:
            assert await log.append([NewRecord(kind="tick")]) == [1]
        finally:
            await log.close()


@pytest.fixture
def foreign_pg_db(pg_url: str) -> Iterator[str]:
    """A scratch PostgreSQL database of this test's own holding another application's table
    (``users``, one row) in its default schema; dropped afterwards."""
    import asyncio

    import asyncpg

    name = f"foldplane_foreign_{uuid.uuid4().hex[:12]}"
    admin = pg_url.rsplit("/", 1)[0] + "/postgres"
    url = pg_url.rsplit("/", 1)[0] + "/" + name

    async def setup() -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE TABLE users (id serial PRIMARY KEY, name text)")
            await conn.execute("INSERT INTO users (name) VALUES ('ada')")
        finally:
            await conn.close()

    async def drop() -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(setup())
    try:
        yield url
    finally:
        asyncio.run(drop())


def pg_contents(url: str) -> tuple[list[tuple[str, str]], list[tuple[str, ...]], list[object]]:
    """Every schema, every table (outside PostgreSQL's own) and the ``users`` rows."""
    import asyncio

    import asyncpg

    async def read() -> tuple[list[tuple[str, str]], list[tuple[str, ...]], list[object]]:
        conn = await asyncpg.connect(url)
        try:
            own = "('pg_catalog', 'information_schema', 'pg_toast')"
            schemas = await conn.fetch(
                f"SELECT nspname FROM pg_namespace WHERE nspname NOT IN {own} ORDER BY 1"
            )
            tables = await conn.fetch(
                f"SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN {own} "
                "ORDER BY 1, 2"
            )
            users = await conn.fetch("SELECT id, name FROM users ORDER BY id")
        finally:
            await conn.close()
        return (
            [tuple(t) for t in tables],
            [tuple(s) for s in schemas],
            [tuple(u) for u in users],
        )

    return asyncio.run(read())


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_every_command_refuses_a_postgres_database_of_another_application(
    foreign_pg_db: str, capsys
):
    """The PostgreSQL side of 'every command that opens a log checks what it opens': serve,
    compact, replay and explain on a database holding another application's tables refuse,
    naming them, and create, migrate or write nothing there (no foldplane table, no schema)."""
    from foldplane.cli import main
    from tests.conftest import free_port

    before = pg_contents(foreign_pg_db)
    assert before[0] == [("public", "users")]
    commands = [  # serve last: on the old code it adopted the database and served
        ["compact", foreign_pg_db],
        ["replay", foreign_pg_db],
        ["explain", foreign_pg_db, "--group", "g", "--rank", "0"],
        ["serve", "--db", foreign_pg_db, "--port", str(free_port())],
    ]
    for args in commands:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "holds no foldplane log (tables: [users])" in err, (args, err)
    assert pg_contents(foreign_pg_db) == before
