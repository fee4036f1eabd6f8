"""Bring a database's schema to this code's head revision when a log is opened.

Rules:

- A database at an older revision is upgraded (Alembic, ``migrations/``), inside a transaction
  that holds the write lock (SQLite ``BEGIN IMMEDIATE``; a PostgreSQL advisory lock), so two
  processes opening the same new log create it once.
- A database at a revision this code does not know was written by a newer foldplane:
  SchemaTooNewError, naming both revisions. Nothing is changed.
- A database already at the head is opened without loading Alembic at all (a fast path that
  keeps ``open_log`` cheap in short-lived processes).
"""

from __future__ import annotations

import functools
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import migrations
from .errors import LogError, SchemaTooNewError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

_SCRIPTS = Path(migrations.__file__).parent


def alembic_config(connection: Any = None) -> Config:
    """An Alembic config pointing at the packaged ``migrations/`` (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


@functools.cache
def code_head() -> str:
    """The newest revision this code ships."""
    head = _scripts().get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


@functools.cache
def _known_revisions() -> frozenset[str]:
    return frozenset(s.revision for s in _scripts().walk_revisions())


def check_known(where: str, revision: str | None) -> None:
    """Raise SchemaTooNewError for a revision this code does not ship (a newer foldplane's)."""
    _check_known(where, revision)


def _check_known(where: str, revision: str | None) -> None:
    if revision is not None and revision not in _known_revisions():
        raise SchemaTooNewError(where, revision, code_head())


def _upgrade_locked(connection: Any, where: str, target: str) -> None:
    """Upgrade under the lock the caller's transaction holds; re-check the revision first."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(connection).get_current_revision()
    _check_known(where, current)
    if current != target:
        command.upgrade(alembic_config(connection), target)


# -- SQLite ----------------------------------------------------------------------------------


def sqlite_revision(path: Path) -> str | None:
    """The file's schema revision read with plain sqlite3 (None: no schema yet)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        has = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
        ).fetchone()
        if not has:
            return None
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


#: How long an opener keeps trying to put a new file in WAL mode while another one holds it.
WAL_SWITCH_TIMEOUT_S = 30.0


def _enter_wal(conn: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another opener holds the file.

    SQLite answers a journal mode change that finds the file locked with "database is locked"
    at once, without calling the busy handler, so two processes opening the same new log (one
    of them inside its migration transaction) would fail the second. It retries every 10 ms
    until ``WAL_SWITCH_TIMEOUT_S``, the same patience as the busy timeout.
    """
    deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def migrate_sqlite(path: Path, where: str, target: str | None = None) -> None:
    """Bring the SQLite file at ``path`` to ``target`` (default: the code's head)."""
    target = target or code_head()
    current = sqlite_revision(path)
    _check_known(where, current)
    if current == target:
        return
    from sqlalchemy import create_engine, event

    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let the "begin" hook below issue BEGIN itself
        dbapi_conn.execute("PRAGMA busy_timeout = 30000")
        _enter_wal(dbapi_conn)

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    try:
        with engine.connect() as conn:
            _upgrade_locked(conn, where, target)
            conn.commit()
    except SchemaTooNewError:
        raise
    except Exception as exc:
        raise LogError(f"could not migrate {where} to revision {target!r}: {exc}") from exc
    finally:
        engine.dispose()


# -- PostgreSQL ------------------------------------------------------------------------------


async def postgres_revision(conn: Any) -> str | None:
    """The schema revision, read on an asyncpg connection whose search_path is the log's."""
    has = await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
    if not has:
        return None
    return await conn.fetchval("SELECT version_num FROM alembic_version")


async def migrate_postgres(
    dsn: str, schema: str | None, where: str, create: bool, target: str | None = None
) -> None:
    """Create the schema if asked, then upgrade it under a per-schema advisory lock."""
    from sqlalchemy.ext.asyncio import create_async_engine

    target = target or code_head()
    connect_args: dict[str, Any] = {}
    if schema:
        connect_args["server_settings"] = {"search_path": schema}
    url = "postgresql+asyncpg://" + dsn.split("://", 1)[1]
    engine = create_async_engine(url, connect_args=connect_args)

    def run(sync_conn: Any) -> None:
        key = f"foldplane-migrate:{schema or 'public'}"
        sync_conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock(hashtext('{key}'))")
        if schema:
            exists = sync_conn.exec_driver_sql(
                f"SELECT 1 FROM pg_namespace WHERE nspname = '{schema}'"
            ).first()
            if not exists:
                if not create:
                    raise LogError(f"{where} does not exist (schema {schema!r} is missing)")
                sync_conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        _upgrade_locked(sync_conn, where, target)

    try:
        async with engine.connect() as conn:
            await conn.run_sync(run)
            await conn.commit()
    except (SchemaTooNewError, LogError):
        raise
    except Exception as exc:
        raise LogError(f"could not migrate {where} to revision {target!r}: {exc}") from exc
    finally:
        await engine.dispose()
