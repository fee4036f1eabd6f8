"""``open_log``: the one way in. Picks the store from the target and migrates the schema."""

from __future__ import annotations

from pathlib import Path

from .base import Log
from .target import PostgresTarget, parse_target


async def open_log(
    target: str | Path, *, create: bool = True, read_only: bool = False, adopt_empty: bool = False
) -> Log:
    """Open the log at ``target`` (a path, ``sqlite:///...`` or ``postgresql://...``).

    Migrations are applied first; a schema newer than this code raises SchemaTooNewError. With
    ``create=False`` a log that does not exist yet is an error instead of being created. The
    returned Log adopts the head row's current term; call ``claim_term()`` to take the log over.

    ``read_only`` (audits: replay, explain): a SQLite log is opened with ``mode=ro``, never
    created nor migrated, and a file that is not a foldplane log at this code's revision is
    refused naming what it is; a PostgreSQL log's sessions are read-only transactions, with
    the same refusals.

    A file that is not a foldplane log is never written to: a new SQLite log is made only where
    no file is (``create``), or in an empty file when ``adopt_empty`` says so (serve's
    ``--init-empty``); any other file is refused, naming what it is.
    """
    where = parse_target(target)
    if isinstance(where, PostgresTarget):
        from .postgres import open_postgres

        return await open_postgres(where, create and not read_only, read_only=read_only)
    if read_only:
        from .sqlite import open_sqlite_read_only

        return await open_sqlite_read_only(where.path)
    from .sqlite import open_sqlite

    return await open_sqlite(where.path, create, adopt_empty=adopt_empty)
