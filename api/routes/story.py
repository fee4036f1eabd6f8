"""``GET /groups/{group}/ranks/{rank}/story``: why a rank is where it is.

The story is folded from the log by :mod:`coordinator.host.story`, the same code ``python -m
coordinator explain`` runs, up to the offset the coordinator has applied (or ``?until=``). The
fold of a long log is CPU work, so each page of records is stepped in a worker thread
(:func:`step_page`), and at most :data:`CONCURRENT` stories are folded at once
(:func:`story_turn`; a facet's own stories, such as a refit's, wait their turn too). With auth
on it needs the operator token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...coordinator.host.loop import Host
from ...coordinator.host.story import StoryError, story_of
from ...eventlog import Record
from ...wire.codes import RANK_OUT_OF_RANGE
from ...wire.protocol import QUERY
from ..codec import json_response
from ..deps import host_of, require_group, require_operator
from ..errors import ApiError
from ..openapi import answers

router = APIRouter(tags=["console"])

#: Stories folded at the same time; later requests wait their turn.
CONCURRENT = 2
_folding: asyncio.Semaphore | None = None


async def step_page(builder: Any, page: list[Record]) -> None:
    """Step one page of records into a story builder, in a worker thread."""
    await asyncio.to_thread(builder.feed, page)


@router.get(
    "/groups/{group}/ranks/{rank}/story",
    summary="The chain of records that brought a rank to its state and its place in or out of "
    "active_ranks, each with offset, time and the fold's reason",
    responses=answers({200: "StoryBody"}, 401, 403, 404, 422),
)
async def rank_story(
    request: Request,
    group: str = Path(..., max_length=QUERY.group_chars),
    rank: int = Path(..., ge=0, le=2**31),
    until: int | None = Query(
        None, ge=1, le=QUERY.max_offset, description="fold only up to this offset"
    ),
) -> Response:
    require_operator(request, "reading a rank's story")
    host = host_of(request)
    require_group(host, group)
    world_size = host.reads.group_config(group).world_size  # type: ignore[union-attr]
    if rank >= world_size:
        raise ApiError(RANK_OUT_OF_RANGE, f"rank {rank} is not in 0..{world_size - 1} of {group!r}")
    return await told(
        host, until, lambda stop: story_of(host.log, group, rank, until=stop, fold_page=step_page)
    )


async def told(
    host: Host, until: int | None, tell: Callable[[int], Awaitable[dict[str, Any]]]
) -> Response:
    """Every story route's answer: ``tell(stop)``, the story folded up to ``until`` (at most
    what the host applied), in its turn (:func:`story_turn`); its :class:`StoryError` (a
    facet's among them) is the API's error of the same code."""
    stop = host.applied_offset if until is None else min(until, host.applied_offset)
    async with story_turn():
        try:
            story = await tell(stop)
        except StoryError as exc:
            raise ApiError(exc.code, exc.detail) from None
    return json_response(story)


def story_turn() -> asyncio.Semaphore:
    """The semaphore every story waits on (made in the serving event loop)."""
    global _folding
    if _folding is None:
        _folding = asyncio.Semaphore(CONCURRENT)
    return _folding
