"""The application: routes, error handlers, the body size limit and the OpenAPI document.

The app does not own the host: ``serve`` opens the host (log, fold, snapshot) first and hands it
in, so a test or an embedding program can run the same app around a host it controls.
"""

from __future__ import annotations

from fastapi import FastAPI

from ..coordinator.auth import Authenticator
from ..coordinator.fold import registry
from ..coordinator.host.loop import Host
from . import errors, metrics, openapi
from .fastpath import Service
from .limits import Limits
from .routes import agents, audit, console, operator, story

DESCRIPTION = """An event-sourced control plane for elastic torch.distributed process groups.

Every input is appended to a durable log; a pure fold over the log commits group views through
an ACK barrier. Errors are `{"error": code, "detail": message}`. See docs/protocol.md."""


def create_app(
    host: Host, auth: Authenticator | None = None, *, limits: Limits | None = None
) -> Service:
    """The ASGI application to serve: the FastAPI app behind the body guards and the fast path
    for agent events (``Service.app`` is the FastAPI app itself)."""
    limits = limits or Limits()
    app = FastAPI(title="foldplane coordinator", version="0.1.0", description=DESCRIPTION)
    app.state.host = host
    app.state.auth = auth or Authenticator()
    app.state.limits = limits
    app.state.metrics = metrics.Exposition(host)  # the app's own registry, not the global one
    app.state.admitted_groups = {}  # POST /groups admitted, not yet answered (api.routes.operator)
    errors.install(app)
    app.include_router(operator.router)
    for plugin in host.facets.plugins:  # each of the host's facets' routes (registry.Facets)
        routes = registry.part(plugin, "routes")
        if routes is not None:
            app.include_router(routes.router)
    app.include_router(agents.router)
    app.include_router(audit.router)
    app.include_router(story.router)
    app.include_router(console.router)
    openapi.install(app)
    return Service(app, max_body_bytes=limits.max_body_bytes)
