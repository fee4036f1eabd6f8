"""The toy facet's inputs, declared here by their owner: the operator's bump and a rank's add.
Each is the one declaration of its fields: the agent's ``AddEvent`` (``protocol.py``) and the
route's ``BumpRequest`` (``routes.py``) are made from them (``wire.protocol.agent_event``,
``request_body``), with the wire's bound on ``by`` (``OnWire``); the fold decodes each input
into its Struct, after its own check (:func:`by_problem`), and dispatches on the class. Pure:
the worker imports it."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from foldplane.wire.inputs import OnWire

#: The most one bump may add.
MAX_BY = 1000
#: What the wire takes as ``by`` (the fold checks the facet's own bound, :data:`MAX_BY`).
By = Annotated[int, Meta(ge=-(2**31), le=2**31)]


class BumpInput(msgspec.Struct, frozen=True, kw_only=True):
    """``toy_bump``: the operator raises the group's counter by ``by``."""

    kind: ClassVar[str] = "toy_bump"
    by: Annotated[int, OnWire(By)]


class AddInput(msgspec.Struct, frozen=True, kw_only=True):
    """``toy_add``: a rank's current incarnation raises its group's counter by ``by``."""

    kind: ClassVar[str] = "toy_add"
    incarnation: str
    by: Annotated[int, OnWire(By)]


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[BumpInput] | type[AddInput]] = {"toy_bump": BumpInput, "toy_add": AddInput}


def by_problem(payload: object) -> str | None:
    """The shape check both inputs share: ``by`` an integer from 1 to :data:`MAX_BY`."""
    by = payload.get("by") if isinstance(payload, dict) else None
    if type(by) is not int or not 1 <= by <= MAX_BY:
        return f"by must be an integer from 1 to {MAX_BY}, got {by!r}"
    return None
