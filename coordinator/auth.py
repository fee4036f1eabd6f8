"""Who may speak to the coordinator: the operator token and per-(group, rank) agent tokens.

Rules (docs/protocol.md, "Auth"):

- The *operator token* is ``FOLDPLANE_TOKEN``. It is required by the mutating operator
  endpoints and is accepted everywhere an agent token is.
- An *agent token* speaks for exactly one ``(group, rank)``:
  ``fpa1.<group>.<rank>.<hex HMAC-SHA256(FOLDPLANE_SECRET, "<group>\\x00<rank>")>``. The server
  keeps no list of tokens; it recomputes the MAC, so a token cannot be forged without the secret
  and cannot be replayed for another rank (the rank is inside the MAC).
- With neither value configured, auth is off and every caller is the operator. The server then
  refuses a non-loopback bind unless told ``--insecure`` (see :func:`check_bind`).

Tokens are parsed strictly: a bearer token is RFC 6750's ``b64token`` (ASCII letters, digits and
``-._~+/``, then ``=`` padding), and an agent token's rank is plain ASCII digits without a
leading zero, at most 65535. Anything else is a malformed token, ``401``, decided before any
number is parsed (``str.isdigit`` accepts ``"\u00b2"``, which ``int`` then refuses).
Comparisons use :func:`hmac.compare_digest` so that timing does not leak how much of a token
matched.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from ..wire.auth import TOKEN_PREFIX, agent_mac
from ..wire.codes import FORBIDDEN, UNAUTHORIZED, status_of
from ..wire.protocol import QUERY

#: RFC 6750, section 2.1: the syntax of a bearer token.
B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
#: An agent token's rank: ASCII digits, no leading zero, within the ranks a group may have.
RANK_TEXT = re.compile(r"0|[1-9][0-9]{0,4}")
MAX_RANK = QUERY.max_rank


class AuthError(Exception):
    """A request that cannot be authenticated: 401 (no token) or 403 (a wrong one)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status_of(code)
        self.code = code
        self.detail = detail


class BindRefused(Exception):
    """A non-loopback bind without auth, which would expose an open control plane."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a token speaks for. ``kind`` is ``operator`` or ``agent``."""

    kind: Literal["operator", "agent"]
    group: str | None = None
    rank: int | None = None
    #: further ranks of ``group`` this caller speaks for (a per-host channel presents one agent
    #: token per rank it carries)
    more_ranks: frozenset[int] = frozenset()

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"

    def speaks_for(self, group: str, rank: int) -> bool:
        """True when this principal may send events or read updates for ``(group, rank)``."""
        return self.is_operator or (
            self.group == group and (self.rank == rank or rank in self.more_ranks)
        )

    def may_propose_in(self, group: str) -> bool:
        return self.is_operator or self.group == group

    def describe(self) -> str:
        if self.is_operator:
            return "the operator"
        if self.more_ranks:
            return f"agents {self.group}/{sorted({self.rank, *self.more_ranks})}"
        return f"agent {self.group}/{self.rank}"


OPERATOR = Principal("operator")


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Turns an ``Authorization`` header into a :class:`Principal`, or raises :class:`AuthError`."""

    operator_token: str | None = None
    secret: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.operator_token or self.secret)

    def authenticate(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return OPERATOR
        if not authorization:
            raise AuthError(UNAUTHORIZED, "missing Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(UNAUTHORIZED, "the Authorization header must be 'Bearer <token>'")
        if "," in token:
            return self._several(token.split(","))
        return self.principal_for(token)

    def _several(self, tokens: list[str]) -> Principal:
        """``Bearer t1,t2,...``: one agent token per rank a per-host channel carries, all of
        one group (or the operator token)."""
        if len(tokens) > 1024:
            raise AuthError(UNAUTHORIZED, f"{len(tokens)} tokens; at most 1024 in one header")
        principals = [self.principal_for(t.strip()) for t in tokens]
        if any(p.is_operator for p in principals):
            return OPERATOR
        groups = {p.group for p in principals}
        if len(groups) != 1:
            raise AuthError(
                FORBIDDEN, f"the tokens speak for several groups {sorted(map(str, groups))}"
            )
        first = principals[0]
        rest = frozenset(p.rank for p in principals[1:] if p.rank is not None)
        return Principal("agent", first.group, first.rank, rest - {first.rank})

    def principal_for(self, token: str) -> Principal:
        """The principal a bare token speaks for (also used for per-event tokens)."""
        if self.operator_token and hmac.compare_digest(
            token.encode(), self.operator_token.encode()
        ):
            return OPERATOR
        if not B64TOKEN.fullmatch(token):
            raise AuthError(
                UNAUTHORIZED,
                "the token is malformed: a bearer token is ASCII letters, digits and -._~+/",
            )
        if token.startswith(TOKEN_PREFIX + ".") and self.secret:
            head, _, mac = token.rpartition(".")
            group, _, rank_text = head[len(TOKEN_PREFIX) + 1 :].rpartition(".")
            if group and RANK_TEXT.fullmatch(rank_text) and int(rank_text) <= MAX_RANK:
                rank = int(rank_text)
                if hmac.compare_digest(mac.encode(), agent_mac(self.secret, group, rank).encode()):
                    return Principal("agent", group, rank)
            raise AuthError(FORBIDDEN, "the agent token is not valid for this server")
        raise AuthError(FORBIDDEN, "the token is neither the operator token nor an agent token")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Authenticator, *, insecure: bool) -> None:
    """Refuse to serve an open control plane beyond this machine.

    Without a token or secret anyone who reaches the port could deactivate ranks, so a bind to
    anything but a loopback address needs auth, or an explicit ``--insecure``.
    """
    if auth.enabled or insecure or is_loopback(host):
        return
    raise BindRefused(
        f"refusing to bind {host!r} without auth: set FOLDPLANE_TOKEN and FOLDPLANE_SECRET, "
        "bind 127.0.0.1, or pass --insecure"
    )
