"""How reasons and error messages name ranks: every list in full when short, abridged when long,
so a message about a 4,096-rank group stays readable."""

from __future__ import annotations

from collections.abc import Iterable

#: How many ranks a message lists before it abridges.
LIMIT = 16


def ranks_text(ranks: Iterable[int], limit: int = LIMIT) -> str:
    """``[0, 1, 2]``, or ``[0, 1, ... (+98 more)]`` for long lists (sorted either way)."""
    items = sorted(ranks)
    if len(items) <= limit:
        return "[" + ", ".join(map(str, items)) + "]"
    return "[" + ", ".join(map(str, items[:limit])) + f", ... (+{len(items) - limit} more)]"


def abridged(parts: list[str], limit: int = LIMIT) -> str:
    """``a, b, c`` or ``a, b, ... (+7 more)``: the same rule for any list of phrases."""
    text = ", ".join(parts[:limit])
    if len(parts) > limit:
        text += f", ... (+{len(parts) - limit} more)"
    return text
