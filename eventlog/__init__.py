"""The durable append-only log every input of foldplane goes through (see docs/eventlog.md).

The I/O half (stores, migrations) is imported lazily, on first use of one of its names, so that
the pure fold can import :mod:`eventlog.record` without pulling asyncio, sqlite3 or asyncpg into
its process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .record import (
    KINDS,
    MAX_PAYLOAD_BYTES,
    READ_PAGE,
    Encoded,
    InvalidRecord,
    NewRecord,
    Record,
)

if TYPE_CHECKING:
    from .base import Log, RemovedRange
    from .errors import (
        ChecksumError,
        LogClosed,
        LogError,
        SchemaTooNewError,
        StaleTermError,
    )
    from .open import open_log
    from .projection import ProjectionRow

_LAZY = {
    "Log": "foldplane.eventlog.base",
    "RemovedRange": "foldplane.eventlog.base",
    "ChecksumError": "foldplane.eventlog.errors",
    "LogClosed": "foldplane.eventlog.errors",
    "LogError": "foldplane.eventlog.errors",
    "SchemaTooNewError": "foldplane.eventlog.errors",
    "StaleTermError": "foldplane.eventlog.errors",
    "open_log": "foldplane.eventlog.open",
    "ProjectionRow": "foldplane.eventlog.projection",
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
