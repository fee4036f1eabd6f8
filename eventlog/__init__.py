"""The durable append-only log every input of foldplane goes through (see docs/eventlog.md)."""

from eventlog.base import Log
from eventlog.errors import ChecksumError, LogClosed, LogError, SchemaTooNewError, StaleTermError
from eventlog.open import open_log
from eventlog.projection import ProjectionRow
from eventlog.record import KINDS, MAX_PAYLOAD_BYTES, InvalidRecord, NewRecord, Record

__all__ = [
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
    "SchemaTooNewError",
    "StaleTermError",
    "open_log",
]
