"""The fast paths of fencing: nearly every input is a current rank's heartbeat, and a view
change brings an ACK from every participant, so those two are accepted at once by a check that
accepts only what every full check (``fencing.checked_refusal``) would; anything else, refused
or not, is decided and worded by the full checks (``tests/fold/test_fencing.py`` holds the fast
paths to that).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...wire.inputs import MAX_ID_LEN
from .effects import OFFLINE
from .state import FAILED, GroupState


def current_beat(
    groups: Mapping[str, GroupState], group: str | None, rank: int | None, payload: Any
) -> bool:
    """Whether this is the heartbeat of a rank's current, not OFFLINE, incarnation in a group
    that has not failed, with a well-formed payload: one that :func:`refusal` accepts. False
    says nothing (the full checks decide)."""
    if type(payload) is not dict or type(rank) is not int or group is None:
        return False
    g = groups.get(group)
    if g is None or not 0 <= rank < g.config.world_size or g.formation == FAILED:
        return False
    info = g.ranks[rank]
    incarnation = payload.get("incarnation")
    version = payload.get("version")
    return (
        incarnation is not None
        and incarnation == info.incarnation  # a joined incarnation: a valid one
        and info.state != OFFLINE
        and "ranks" not in payload
        and (version is None or (type(version) is int and version >= 0))
    )


def current_ack(
    groups: Mapping[str, GroupState], group: str | None, rank: int | None, payload: Any
) -> bool:
    """Whether this is the ACK of the version being prepared by a participant that the change
    still counts (not dropped), from its current, not OFFLINE, incarnation, with a well-formed
    payload: one that :func:`refusal` accepts. False says nothing (the full checks decide)."""
    if type(payload) is not dict or type(rank) is not int or group is None:
        return False
    g = groups.get(group)
    if g is None or not 0 <= rank < g.config.world_size or g.formation == FAILED:
        return False
    change = g.change
    if change is None:
        return False
    info = g.ranks[rank]
    incarnation = payload.get("incarnation")
    version = payload.get("version")
    return (
        type(incarnation) is str
        and 0 < len(incarnation) <= MAX_ID_LEN
        and incarnation == info.incarnation
        and info.state != OFFLINE
        and type(version) is int
        and version >= 1
        and version == change.version
        and rank in change.members
        and rank not in change.dropped
    )


def beats_not_current(
    groups: Mapping[str, GroupState], group: str, ranks: Sequence[int], payloads: Sequence[Any]
) -> list[int]:
    """The positions of the beats ``(ranks[i], payloads[i])`` of ``group`` that
    :func:`current_beat` does not accept: the others are current. One call for an agent host's
    beats (the group is looked up once): the same verdict as :func:`current_beat` for each."""
    g = groups.get(group)
    if g is None or g.formation == FAILED:
        return list(range(len(ranks)))
    world_size = g.config.world_size
    infos = g.ranks
    out: list[int] = []
    for i, rank in enumerate(ranks):
        payload = payloads[i]
        if type(payload) is not dict or type(rank) is not int or not 0 <= rank < world_size:
            out.append(i)
            continue
        info = infos[rank]
        incarnation = payload.get("incarnation")
        version = payload.get("version")
        if not (
            incarnation is not None
            and incarnation == info.incarnation
            and info.state != OFFLINE
            and "ranks" not in payload
            and (version is None or (type(version) is int and version >= 0))
        ):
            out.append(i)
    return out
