"""The durable append-only log every input of foldplane goes through (see docs/eventlog.md).

The I/O half (stores, migrations) is imported lazily, on first use of one of its names, so that
the pure fold can import :mod:`eventlog.record` without pulling asyncio, sqlite3 or asyncpg into
its process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eventlog.record import (
    KINDS,
    MAX_PAYLOAD_BYTES,
    READ_PAGE,
    Encoded,
    InvalidRecord,
    NewRecord,
    Record,
)

if TYPE_CHECKING:
    from eventlog.base import Log, RemovedRange
    from eventlog.errors import (
        ChecksumError,
        LogClosed,
        LogError,
        SchemaTooNewError,
        StaleTermError,
    )
    from eventlog.open import open_log
    from eventlog.projection import ProjectionRow

_LAZY = {
    "Log": "eventlog.base",
    "RemovedRange": "eventlog.base",
    "ChecksumError": "eventlog.errors",
    "LogClosed": "eventlog.errors",
    "LogError": "eventlog.errors",
    "SchemaTooNewError": "eventlog.errors",
    "StaleTermError": "eventlog.errors",
    "open_log": "eventlog.open",
    "ProjectionRow": "eventlog.projection",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'eventlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Encoded",
    "READ_PAGE",
    "KINDS",
    "MAX_PAYLOAD_BYTES",
    "ChecksumError",
    "InvalidRecord",
    "Log",
    "LogClosed",
    "LogError",
    "NewRecord",
    "ProjectionRow",
    "Record",
    "RemovedRange",
    "SchemaTooNewError",
    "StaleTermError",
    "open_log",
]
