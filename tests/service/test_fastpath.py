"""Which long-poll queries the fast path takes, and which it leaves to the framework."""

from __future__ import annotations

import pytest

from api.fastpath import updates_query


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b"group=g&rank=3&after=10&timeout=30", ("g", 3, 10, 30.0)),
        (b"group=g&rank=3", ("g", 3, 0, 25.0)),  # the route's defaults
        (b"group=g&rank=3&timeout=1.5", ("g", 3, 0, 1.5)),
        (b"group=g%2Ex&rank=65535&after=4611686018427387904", ("g.x", 65535, 2**62, 25.0)),
    ],
)
def test_plain_queries_are_parsed_to_the_routes_bounds(raw: bytes, parsed: tuple) -> None:
    assert updates_query(raw) == parsed


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"group=g",  # rank is required
        b"group=&rank=1",
        b"group=g&rank=-1",
        b"group=g&rank=65536",
        b"group=g&rank=1&after=4611686018427387905",
        b"group=g&rank=1&timeout=61",
        b"group=g&rank=1&timeout=inf",
        b"group=g&rank=1&timeout=1e1",
        b"group=g&group=h&rank=1",  # repeated
        b"group=g&rank=1&extra=2",  # unknown
        b"group=" + b"a" * 65 + b"&rank=1",
        b"group=g&rank=%FF",
        b"group=g&rank=1&&",
    ],
)
def test_anything_else_goes_to_the_framework(raw: bytes) -> None:
    assert updates_query(raw) is None
