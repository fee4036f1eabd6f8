"""What every route needs from the application: the host, and who is calling."""

from __future__ import annotations

from starlette.requests import Request

from ..coordinator.auth import Authenticator, Principal
from ..coordinator.host.loop import Host
from ..wire.codes import FORBIDDEN, UNKNOWN_GROUP
from .errors import ApiError


def host_of(request: Request) -> Host:
    return request.app.state.host


def principal_of(request: Request) -> Principal:
    auth: Authenticator = request.app.state.auth
    return auth.authenticate(request.headers.get("authorization"))


def require_operator(request: Request, action: str) -> Principal:
    principal = principal_of(request)
    if not principal.is_operator:
        raise ApiError(
            FORBIDDEN, f"{action} needs the operator token, not {principal.describe()}'s"
        )
    return principal


def require_group(host: Host, group: str) -> None:
    if host.reads.group_config(group) is None:
        raise ApiError(UNKNOWN_GROUP, f"no group {group!r}")
