"""Pages of the log and of the view history that stay within a byte budget.

``GET /views/history`` and ``GET /events`` take a ``limit`` in items, but one item may be large:
a view of a 65,536-rank group is about a megabyte, a record up to the body limit. A page is read
from the log in small chunks and stops growing once its items pass ``Limits.max_page_bytes``
(it always holds at least one), so a reader without credentials cannot make the server read
and encode a gigabyte at once; the answer's cursor says where the next page starts, as for a
page cut by ``limit``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Items read from the log at a time while a page is filled.
CHUNK = 16


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[bytes]
    #: The cursor of the last item in the page (``after`` when the page is empty).
    last: int
    #: Whether items follow the page.
    more: bool


async def read_page(
    fetch: Callable[[int, int], Awaitable[list[T]]],
    cursor: Callable[[T], int],
    encode: Callable[[T], bytes],
    *,
    after: int,
    limit: int,
    budget: int,
) -> Page[T]:
    """Up to ``limit`` items after ``after`` (``fetch(after, n)`` reads at most ``n``, in cursor
    order), each encoded, stopping early once their bytes reach ``budget``."""
    items: list[bytes] = []
    size = 0
    last = after
    while len(items) < limit and size < budget:
        want = min(CHUNK, limit - len(items))
        chunk = await fetch(last, want)
        for item in chunk:
            encoded = encode(item)
            items.append(encoded)
            size += len(encoded)
            last = cursor(item)
            if size >= budget:
                break
        if len(chunk) < want and size < budget:  # the log has nothing after these
            return Page(items, last, False)
    return Page(items, last, bool(await fetch(last, 1)))
