"""torchft's ``LighthouseService`` over gRPC (``serve --lighthouse-port``): the service torchft's
managers find through ``TORCHFT_LIGHTHOUSE=http://host:port``.

The two methods, ``/torchft.LighthouseService/Quorum`` and ``/Heartbeat``, take and answer
the bytes of torchft's messages (``messages.py``); the calls are carried out by the
coordinator's lighthouse (``host.LighthouseHost``). What a call gets back:

==============================  ==============================================================
``OK``                          the quorum (or an empty heartbeat answer)
``INVALID_ARGUMENT``            a message that cannot be read, or a field out of its bounds:
                                the detail names the message, the field and why
``RESOURCE_EXHAUSTED``          a message over ``messages.MAX_MESSAGE_BYTES`` (refused by gRPC
                                before it is read)
``FAILED_PRECONDITION``         the lighthouse refuses it as it stands (an incarnation that
                                was reported lost; no settings in the log)
``DEADLINE_EXCEEDED``           no quorum took the caller in before its deadline
``UNAVAILABLE``                 no coordinator could take it (the coordinator is shutting
                                down, or no leader before the deadline)
``UNIMPLEMENTED``               any other method
==============================  ==============================================================

torchft's protocol has no field for a token, so this port authenticates nobody: whoever reaches
it may ask for quorums and heartbeat under any replica id. It binds where the operator says
(``--lighthouse-host``, loopback by default); docs/torchft.md says who should reach it.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ...wire.codes import INVALID_EVENT
from .host import (
    LighthouseHost,
    LighthouseRefused,
    LighthouseUnavailable,
)
from .messages import (
    HEARTBEAT_RESPONSE,
    MAX_MESSAGE_BYTES,
    SERVICE,
    MessageError,
    decode_heartbeat_request,
    decode_quorum_request,
    encode_quorum_response,
)

log = logging.getLogger("foldplane.lighthouse")

#: How long a quorum call without a deadline may wait (torchft's manager always sends one).
NO_DEADLINE_S = 3600.0


def _bytes(message: bytes) -> bytes:
    return message


def _refused(exc: LighthouseRefused) -> grpc.StatusCode:
    return (
        grpc.StatusCode.INVALID_ARGUMENT
        if exc.code == INVALID_EVENT
        else (grpc.StatusCode.FAILED_PRECONDITION)
    )


class LighthouseService:
    """The gRPC service of one coordinator's lighthouse."""

    def __init__(self, lighthouse: LighthouseHost) -> None:
        self.lighthouse = lighthouse

    async def quorum(self, request: bytes, context: Any) -> bytes:
        try:
            member = decode_quorum_request(request)
        except MessageError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        left = context.time_remaining()
        timeout = NO_DEADLINE_S if left is None else max(0.0, min(left, NO_DEADLINE_S))
        try:
            quorum = await self.lighthouse.quorum(member, timeout)
        except LighthouseRefused as exc:
            await context.abort(_refused(exc), f"{exc.code}: {exc.detail}")
        except LighthouseUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except TimeoutError as exc:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                str(exc) or f"no quorum took {member.replica_id!r} in before its deadline",
            )
        return encode_quorum_response(quorum)

    async def heartbeat(self, request: bytes, context: Any) -> bytes:
        try:
            replica_id = decode_heartbeat_request(request)
        except MessageError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            await self.lighthouse.heartbeat([replica_id])
        except LighthouseRefused as exc:
            await context.abort(_refused(exc), f"{exc.code}: {exc.detail}")
        except LighthouseUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return HEARTBEAT_RESPONSE

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Quorum": grpc.unary_unary_rpc_method_handler(
                    self.quorum, request_deserializer=_bytes, response_serializer=_bytes
                ),
                "Heartbeat": grpc.unary_unary_rpc_method_handler(
                    self.heartbeat, request_deserializer=_bytes, response_serializer=_bytes
                ),
            },
        )


def bind_address(host: str, port: int) -> str:
    """gRPC's form of an address: IPv6 in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start(lighthouse: LighthouseHost, host: str, port: int) -> tuple[Any, int]:
    """Serve the lighthouse on ``host:port`` (0: a free port); the server and its port.
    Raises OSError when the address cannot be bound."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 64 * MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((LighthouseService(lighthouse).handler(),))
    try:
        bound = server.add_insecure_port(bind_address(host, port))
    except RuntimeError as exc:
        raise OSError(f"cannot bind the lighthouse to {bind_address(host, port)}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot bind the lighthouse to {bind_address(host, port)}")
    await server.start()
    return server, bound
