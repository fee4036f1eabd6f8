"""``GET /events/stream``: the log as server-sent events, one per record.

Each event is ``id: <offset>``, ``event: <kind>``, ``data: <record JSON>``. A client that
reconnects sends ``Last-Event-ID`` (or ``after``) and resumes exactly after it: the stream reads
the log itself, so nothing depends on what this server happened to keep in memory. A comment
line every ``keepalive_s`` keeps proxies from closing an idle stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from ..eventlog import Log, LogClosed, Record

_encoder = msgspec.json.Encoder()


def format_event(rec: Record) -> bytes:
    data = _encoder.encode(
        {
            "offset": rec.offset,
            "ts": rec.ts,
            "term": rec.term,
            "kind": rec.kind,
            "group": rec.group,
            "rank": rec.rank,
            "payload": rec.payload,
        }
    )
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (rec.offset, rec.kind.encode(), data)


async def stream(
    log: Log,
    after: int,
    *,
    group: str | None,
    kinds: list[str] | None,
    keepalive_s: float = 15.0,
    page: int = 500,
) -> AsyncIterator[bytes]:
    position = after
    yield b": foldplane event stream\n\n"
    try:
        while True:
            head = await log.head()
            while position < head:
                records = await log.read(position, page, group=group, kinds=kinds, until=head)
                for rec in records:
                    yield format_event(rec)
                position = records[-1].offset if len(records) == page else head
            if await log.wait(position, timeout=keepalive_s) <= position:
                yield b": keepalive\n\n"
    except LogClosed:
        return
