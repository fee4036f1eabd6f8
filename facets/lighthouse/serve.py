"""The lighthouse facet's part of ``serve`` (its plugin's ``serve``, ``coordinator/fold/registry.py``):
the ``--lighthouse-*`` options, their check, and torchft's gRPC ``LighthouseService`` started
beside the HTTP server and closed before the host (``service.py``, docs/torchft.md).

Its port authenticates nobody (torchft's protocol has no field for a token), so it binds where
the operator says (``--lighthouse-host``, loopback by default) and ``serve`` warns when that is
not loopback. The gRPC server and the host part are imported only when the port is asked for,
so a parser that lists these options loads neither gRPC nor the host.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from .effects import Settings


def options(p: argparse.ArgumentParser) -> None:
    """``serve``'s options for torchft's lighthouse."""
    lh = p.add_argument_group(
        "torchft's lighthouse (docs/torchft.md): its quorum rule's settings are named and "
        "defaulted as torchft_lighthouse's own"
    )
    lh.add_argument(
        "--lighthouse-port",
        type=int,
        default=None,
        metavar="N",
        help="serve torchft's LighthouseService (gRPC) on this port (0: any free port); "
        "torchft's managers find it through TORCHFT_LIGHTHOUSE=http://HOST:N",
    )
    lh.add_argument(
        "--lighthouse-host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="where the lighthouse binds (default 127.0.0.1). Its protocol carries no token: "
        "whoever reaches it may take part in quorums",
    )
    lh.add_argument(
        "--lighthouse-min-replicas",
        type=int,
        default=None,
        metavar="N",
        help="the fewest replica groups a new quorum may have (torchft's --min_replicas; "
        "required with --lighthouse-port, as torchft requires it)",
    )
    lh.add_argument(
        "--lighthouse-join-timeout-ms",
        type=int,
        default=60_000,
        metavar="MS",
        help="how long a quorum waits for heartbeating replica groups that have not asked yet "
        "(default 60000)",
    )
    lh.add_argument(
        "--lighthouse-quorum-tick-ms",
        type=int,
        default=100,
        metavar="MS",
        help="the least time between two ticks of the quorum rule while a quorum waits "
        "(default 100)",
    )
    lh.add_argument(
        "--lighthouse-heartbeat-timeout-ms",
        type=int,
        default=5_000,
        metavar="MS",
        help="how long after its last heartbeat a replica group counts as dead (default 5000)",
    )


def check(args: argparse.Namespace) -> str | None:
    """Check the ``--lighthouse-*`` options; ``args.lighthouse`` becomes the quorum rule's
    settings (None without ``--lighthouse-port``). What is wrong, or None."""
    args.lighthouse = None
    if args.lighthouse_port is None:
        return None
    if not 0 <= args.lighthouse_port <= 65535:
        return f"--lighthouse-port must be from 0 to 65535, got {args.lighthouse_port}"
    if args.lighthouse_min_replicas is None:
        return (
            "--lighthouse-port needs --lighthouse-min-replicas (torchft's lighthouse has no "
            "default for --min_replicas either)"
        )
    settings = Settings(
        min_replicas=args.lighthouse_min_replicas,
        join_timeout_ms=args.lighthouse_join_timeout_ms,
        quorum_tick_ms=args.lighthouse_quorum_tick_ms,
        heartbeat_timeout_ms=args.lighthouse_heartbeat_timeout_ms,
    )
    if (problem := settings.problem()) is not None:
        return f"--lighthouse-*: {problem}"
    args.lighthouse = settings
    return None


class Served:
    """The running lighthouse: the gRPC server and the lighthouse it serves."""

    def __init__(self, server: Any, lighthouse: Any) -> None:
        self.server = server
        self.lighthouse = lighthouse

    async def close(self) -> None:
        """Stop taking calls (a second for those in flight), then answer every call still
        waiting that the coordinator is shutting down."""
        await self.server.stop(1.0)
        await self.lighthouse.close()


async def start(args: argparse.Namespace, host: Any, auth: Any) -> Served | None:
    """Start torchft's lighthouse service on this coordinator (``--lighthouse-port``, checked
    by :func:`check`), or None without the option. Raises OSError, naming the option, when its
    address cannot be bound."""
    if args.lighthouse is None:
        return None
    from ...coordinator.auth import is_loopback
    from . import service
    from .host import serve_lighthouse

    lighthouse = serve_lighthouse(
        host, args.lighthouse, flush_s=args.heartbeat_flush_s, token=auth.operator_token
    )
    try:
        server, port = await service.start(lighthouse, args.lighthouse_host, args.lighthouse_port)
    except OSError as exc:
        await lighthouse.close()
        raise OSError(f"--lighthouse-port: {exc}") from None
    where = service.bind_address(args.lighthouse_host, port)
    log = logging.getLogger("foldplane")
    log.info("torchft lighthouse on %s (TORCHFT_LIGHTHOUSE=http://%s)", where, where)
    if not is_loopback(args.lighthouse_host):
        log.warning(
            "the torchft lighthouse binds %s: its protocol carries no token, so any process "
            "that reaches it may ask for quorums and heartbeat as any replica group "
            "(docs/torchft.md, Exposure)",
            where,
        )
    return Served(server, lighthouse)
