"""A minimal HTTP/1.1 keep-alive client on an asyncio protocol, for simulated agents and load.

General-purpose clients (httpx, aiohttp) spend more CPU per request than the coordinator does
to serve it, and the load generator shares the machine with the server, so the benchmarks
speak plain HTTP/1.1 themselves: one persistent connection, one request at a time on it,
pre-encoded JSON, Content-Length framing (which is all the coordinator's answers use). An
answer is parsed once it is whole, straight from the bytes received, instead of line by line
through a stream reader: every microsecond the generator spends is taken from the same
cores the coordinator runs on, and a late generator sends late (which counts in the latency).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

_encode = msgspec.json.encode
_decode = msgspec.json.decode


class HttpError(Exception):
    pass


class _Answers(asyncio.Protocol):
    """Collects the bytes of one connection and hands each whole answer to its waiter."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost: BaseException | None = None
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = HttpError(f"the server closed the connection ({exc or 'EOF'})")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            return
        buffer = self.buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            length = 0
        else:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
        total = end + 4 + length
        if len(buffer) < total:
            return
        status = int(head.split(b" ", 2)[1])
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        self.waiter.set_result((status, body))


class Connection:
    """One keep-alive connection, one request at a time. ``bytes_received`` counts every byte
    the server sent on it (headers included): what a simulated agent host costs the network."""

    def __init__(self, host: str, port: int, *, authorization: str | None = None) -> None:
        self.host = host
        self.port = port
        self._auth = b"authorization: %s\r\n" % authorization.encode() if authorization else b""
        self._protocol: _Answers | None = None
        self.bytes_received = 0

    async def open(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, self._protocol = await loop.create_connection(_Answers, self.host, self.port)
        return self

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request and return ``(status, decoded JSON body)``. ``body`` is encoded to
        JSON, unless it is ``bytes`` already (a request body encoded once and sent many times)."""
        if self._protocol is None:
            await self.open()
        protocol = self._protocol
        assert protocol is not None and protocol.transport is not None
        if protocol.lost is not None:
            raise protocol.lost
        if body is None:
            payload = b""
        elif isinstance(body, bytes):
            payload = body
        else:
            payload = _encode(body)
        protocol.waiter = asyncio.get_running_loop().create_future()
        protocol.transport.write(
            b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"%scontent-length: %d\r\n\r\n%s"
            % (
                method.encode(),
                path.encode(),
                self.host.encode(),
                self._auth,
                len(payload),
                payload,
            )
        )
        before = protocol.received - len(protocol.buffer)
        try:
            status, data = await protocol.waiter
        finally:
            self.bytes_received += protocol.received - len(protocol.buffer) - before
        return status, (_decode(data) if data else None)
