"""Fixtures of the data plane suites: a TCPStore hosted by the test process, as the coordinator does."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from datetime import timedelta

import pytest

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from torch.distributed import TCPStore  # noqa: E402

from foldplane.agent.dataplane import DataPlane  # noqa: E402


@pytest.fixture
def store() -> TCPStore:
    return TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )


@pytest.fixture
def make_plane(store: TCPStore) -> Iterator:
    """Data planes in this process, on the test's store; all closed at the end."""
    planes: list[DataPlane] = []

    def make(rank: int = 0, world_size: int = 2, **kwargs: object) -> DataPlane:
        kwargs.setdefault("collective_timeout_s", 5.0)
        dp = DataPlane(
            rank, world_size, "127.0.0.1", store.port, incarnation=uuid.uuid4().hex, **kwargs
        )
        planes.append(dp)
        return dp

    yield make
    for dp in planes:
        dp.close()
