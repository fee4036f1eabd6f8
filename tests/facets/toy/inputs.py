"""The toy facet's inputs, declared here by their owner: the operator's bump and a rank's add
(the agent sends the add as :class:`AddEvent`, whose fields past the envelope are the record's
payload). The fold decodes each input into its Struct and dispatches on the class. Pure: the
worker imports it."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from foldplane.wire.protocol import AgentEventBase

#: The most one bump may add.
MAX_BY = 1000


class BumpInput(msgspec.Struct, frozen=True, kw_only=True):
    """``toy_bump``: the operator raises the group's counter by ``by``."""

    kind: ClassVar[str] = "toy_bump"
    by: int


class AddInput(msgspec.Struct, frozen=True, kw_only=True):
    """``toy_add``: a rank's current incarnation raises its group's counter by ``by``."""

    kind: ClassVar[str] = "toy_add"
    incarnation: str
    by: int


class AddEvent(AgentEventBase, tag="toy_add", kw_only=True, forbid_unknown_fields=True):
    """A rank adds ``by`` to its group's counter (``Agent.send_event(AddEvent, by=...)``); the
    fold bounds ``by``, as it does the operator's bump."""

    by: Annotated[int, Meta(ge=-(2**31), le=2**31)]


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[BumpInput] | type[AddInput]] = {"toy_bump": BumpInput, "toy_add": AddInput}


def by_problem(payload: object) -> str | None:
    """The shape check both inputs share: ``by`` an integer from 1 to :data:`MAX_BY`."""
    by = payload.get("by") if isinstance(payload, dict) else None
    if type(by) is not int or not 1 <= by <= MAX_BY:
        return f"by must be an integer from 1 to {MAX_BY}, got {by!r}"
    return None
