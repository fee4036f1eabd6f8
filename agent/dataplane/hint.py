"""Preallocated ``failed_ranks_hint`` buffers, reused across operations.

Each operation leases one int32 buffer of shape ``(world_size,)`` from the pool and holds it for
as long as its ``Work`` lives, so two operations in flight never share an answer. Buffers come
back when their ``Work`` is dropped and are reused first-in-first-out: a hint tensor the caller
kept after dropping its ``Work`` survives the next ``capacity - 1 - outstanding`` operations.
On the success path nothing is allocated (the buffer is zeroed in place, which a CUDA graph can
capture); the pool grows, permanently, only when more ``Work`` objects are alive than it holds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

import torch


class HintPool:
    """A FIFO pool of int32 hint buffers of shape ``(world_size,)`` on ``device``."""

    def __init__(self, world_size: int, device: torch.device, capacity: int = 8) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.world_size = world_size
        self.device = device
        self._lock = threading.Lock()
        self._free: deque[torch.Tensor] = deque(self._new() for _ in range(capacity))
        self._allocated = capacity

    def _new(self) -> torch.Tensor:
        return torch.zeros(self.world_size, dtype=torch.int32, device=self.device)

    @property
    def allocated(self) -> int:
        """How many buffers the pool has ever allocated (its capacity, grown on demand)."""
        return self._allocated

    def acquire(self) -> torch.Tensor:
        """A zeroed buffer that no other live ``Work`` holds."""
        with self._lock:
            if self._free:
                buf = self._free.popleft()
            else:
                self._allocated += 1
                buf = self._new()
        buf.zero_()
        return buf

    def release(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)


def fill(buf: torch.Tensor, failed_ranks: Iterable[int]) -> None:
    """Write ``failed_ranks`` into ``buf`` in place: 1 for each failed rank, 0 elsewhere."""
    buf.zero_()
    for rank in failed_ranks:
        buf[rank] = 1
