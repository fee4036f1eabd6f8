"""Alembic environment for the log's schema.

Migrations are run by ``eventlog.migrate`` when a log is opened, never from a command line: it
passes an open connection (already inside a transaction that holds the database's write lock
on SQLite, or an advisory lock on PostgreSQL), so two processes opening the same new log do not
both create it.
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "foldplane migrations run when a log is opened (eventlog.open_log), which passes a "
        "connection; there is no offline or command-line mode"
    )

context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
