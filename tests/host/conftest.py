"""The log fixtures of tests/eventlog (a fresh PostgreSQL schema per test) for these suites."""

from tests.eventlog.conftest import pg_schema

__all__ = ["pg_schema"]
