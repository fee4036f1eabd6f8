"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for load generation.

General-purpose clients (httpx, aiohttp) spend more CPU per request than the coordinator does
to serve it, and the load generator shares the machine with the server, so the benchmarks
speak plain HTTP/1.1 themselves: one persistent connection, pre-encoded JSON, Content-Length
framing (which is all the coordinator's answers use).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec

_encode = msgspec.json.encode
_decode = msgspec.json.decode


class HttpError(Exception):
    pass


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
            self._writer = None

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request and return ``(status, decoded JSON body)``."""
        if self._writer is None:
            await self.open()
        assert self._reader is not None and self._writer is not None
        payload = b"" if body is None else _encode(body)
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        ).encode()
        self._writer.write(head + payload)
        status_line = await self._reader.readline()
        if not status_line:
            raise HttpError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await self._reader.readexactly(length) if length else b""
        return status, (_decode(data) if data else None)
