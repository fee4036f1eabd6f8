"""The agent token's format, shared by the coordinator (which checks it) and the launcher (which
hands it to its workers): ``fpa1.<group>.<rank>.<hex HMAC-SHA256(secret, "<group>\\x00<rank>")>``.

How the server authenticates a request with it is ``coordinator/auth.py``'s.
"""

from __future__ import annotations

import hashlib
import hmac

TOKEN_PREFIX = "fpa1"


def agent_mac(secret: str, group: str, rank: int) -> str:
    """The hex HMAC-SHA256 over ``"<group>\\x00<rank>"`` keyed by the server secret."""
    msg = f"{group}\x00{rank}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def agent_token(secret: str, group: str, rank: int) -> str:
    """The agent token for ``(group, rank)``; what ``python -m coordinator token`` prints."""
    if not secret:
        raise ValueError("an agent token needs a non-empty secret (FOLDPLANE_SECRET or --secret)")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank {rank!r} must be a non-negative integer")
    return f"{TOKEN_PREFIX}.{group}.{rank}.{agent_mac(secret, group, rank)}"
