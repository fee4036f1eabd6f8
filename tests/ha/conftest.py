"""Fixtures of the failover suite: real coordinator processes on a fresh PostgreSQL schema."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ha.cluster import Node, drop_schema, new_schema


@pytest.fixture
def schema() -> Iterator[str]:
    """A schema no log lives in yet; dropped after the test (its nodes are stopped first)."""
    name = new_schema()
    yield name
    asyncio.run(drop_schema(name))


@pytest.fixture
def nodes(schema: str, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """``nodes(*args, env=...)`` makes a coordinator process on the test's schema (not started
    yet)."""
    made: list[Node] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Node:
        log_path = tmp_path / f"coordinator-{len(made)}.log"
        node = Node(schema, log_path, args=list(args), env=dict(env or {}))
        made.append(node)
        return node

    yield make
    for node in made:
        node.stop()
