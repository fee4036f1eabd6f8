"""The lighthouse suites use the failover suite's coordinator processes on PostgreSQL."""

from tests.ha.conftest import nodes, schema  # noqa: F401
