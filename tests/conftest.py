"""Fixtures shared by every suite. Each suite keeps its own fixtures in its own conftest.py."""

from __future__ import annotations

import os
import socket

import pytest

PG_URL = os.environ.get("FOLDPLANE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pg_url() -> str:
    """The real PostgreSQL server on 127.0.0.1:5432 (database ``test``)."""
    return PG_URL
