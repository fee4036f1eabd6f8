"""Where a log lives: a SQLite file or a PostgreSQL database (optionally one schema in it).

Accepted targets:

- a filesystem path (``log.db``, ``/var/lib/foldplane/log.db``) or a ``pathlib.Path``;
- ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (SQLAlchemy's spelling);
- ``postgresql://user@host:port/db`` (also ``postgres://`` and ``postgresql+asyncpg://``). The
  query parameter ``schema=NAME`` keeps the log's tables in that schema (created on open when
  ``create=True``), so several logs can share one database. Other query parameters are passed
  to asyncpg as connection options.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import LogError

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class SqliteTarget:
    path: Path

    def describe(self) -> str:
        return f"SQLite log {str(self.path)!r}"


@dataclass(frozen=True)
class PostgresTarget:
    dsn: str  # a libpq URL asyncpg understands, without the ``schema`` parameter
    schema: str | None

    def describe(self) -> str:
        where = urlsplit(self.dsn)
        host = where.hostname or "localhost"
        port = f":{where.port}" if where.port else ""
        return f"PostgreSQL log {host}{port}{where.path}" + (
            f" schema {self.schema!r}" if self.schema else ""
        )


Target = SqliteTarget | PostgresTarget


def parse_target(target: str | Path) -> Target:
    """Turn what a user typed into a target; a LogError names what was not understood."""
    if isinstance(target, Path):
        return SqliteTarget(target)
    if not isinstance(target, str) or not target:
        raise LogError(f"log target must be a path or a URL, got {target!r}")
    scheme, sep, rest = target.partition("://")
    if not sep:
        return SqliteTarget(Path(target))
    scheme = scheme.lower()
    if scheme in ("sqlite", "sqlite+pysqlite"):
        # sqlite:///rel.db -> "rel.db"; sqlite:////abs.db -> "/abs.db" (SQLAlchemy's convention)
        if not rest.startswith("/") or len(rest) < 2:
            raise LogError(f"SQLite URL {target!r} must look like sqlite:///path/to/log.db")
        path = rest[1:].split("?", 1)[0]
        if path in ("", ":memory:"):
            raise LogError(f"SQLite URL {target!r} must name a file (the log is durable)")
        return SqliteTarget(Path(path))
    if scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        parts = urlsplit("postgresql://" + rest)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = None
        kept = []
        for key, value in query:
            if key == "schema":
                if not _SCHEMA_RE.match(value):
                    raise LogError(
                        f"schema {value!r} in {target!r} must be a lower-case SQL identifier "
                        "(letters, digits, _; at most 63)"
                    )
                schema = value
            else:
                kept.append((key, value))
        dsn = urlunsplit(parts._replace(query=urlencode(kept)))
        return PostgresTarget(dsn, schema)
    raise LogError(
        f"log target {target!r} has scheme {scheme!r}; expected a path, sqlite:/// or postgresql://"
    )
