"""A facet's host part: what its effects ask of the host, what a resync sends of it, and what
it tells of a rank's story. Its plugin (``coordinator/fold/registry.py``) names the module
that declares it, as ``HOST``; the host reads every facet's through :func:`facet_hosts`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...eventlog import Record
from ..fold import registry
from ..fold.effects import Effect
from ..fold.machine import Coordinator
from .journal import Update
from .reads import Reads

#: What one of a facet's effects asks of the host: ``(state, effect, ready)``: add its updates
#: to ``ready`` (``coordinator.host.ready.Ready``) and keep in ``state`` (``HostState``) what a
#: resync sends instead of them. (``ready.py`` reads this module, so it is not imported here.)
Carry = Callable[[Any, Any, Any], None]

#: One story entry before its record's fields are added: ``(event, reason, fields)``.
Entry = tuple[str, str, dict[str, Any]]


class RankStoryPart:
    """A facet's part of one rank's story (``coordinator/host/story.py``): what it says at
    fixed points of each step. The story asks every facet's part, in the facets' order, at each
    point; these defaults say nothing."""

    def __init__(self, group: str, rank: int) -> None:
        self.group = group
        self.rank = rank

    def before(self, machine: Coordinator, concerned: bool) -> None:
        """Just before a step; ``concerned``: the record may concern the rank (its group's, or
        a tick) and the rank is in its group."""

    def stepped(
        self, record: Record, effects: list[Effect], machine: Coordinator
    ) -> tuple[list[Entry], list[Entry]]:
        """Right after the step, before membership's entries: ``(decisions, evidence)``."""
        return [], []

    def effect(
        self,
        record: Record,
        effect: Effect,
        machine: Coordinator,
        *,
        was_active: bool,
        active: bool,
    ) -> Entry | None:
        """One effect of a concerned step about the rank's group, after membership's entry for
        it; ``was_active``, ``active``: whether the rank was active before the step and is
        after it."""
        return None

    def summary(self, machine: Coordinator) -> str | None:
        """What the story's summary adds about the rank's place in the facet, or None."""
        return None


@dataclass(frozen=True)
class FacetHost:
    """A facet's host part (its plugin's ``host`` module declares one as ``HOST``)."""

    #: its effects that ask the host for more than their projection rows, and who handles each
    carry: dict[type[Effect], Carry] = field(default_factory=dict)
    #: what a resync of ``(machine, group, ranks)`` sends of it that the fold holds now (what
    #: it keeps in ``HostState.latest`` and ``latest_by_rank`` is sent without asking it)
    resync: Callable[[Coordinator, str, Sequence[int]], list[Update]] | None = None
    #: its part of a rank's story, made for ``(group, rank)``
    story: Callable[[str, int], RankStoryPart] | None = None
    #: how a terminal labels its story events (``explain``): by event, the entry -> its label
    labels: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    #: what a group's update readers must understand because of it, as a phrase (``"reads
    #: epoch plans"``), or None: a reader that does not name every revision of the protocol is
    #: refused then (``api.routes.agents.refuse_unnamed_revisions``)
    readers_need: Callable[[Reads, str], str | None] | None = None
    #: the operator's log line of its effects that decide something (``decisions.py``), by type
    decisions: dict[type[Effect], Callable[[Any], str | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Parts:
    hosts: tuple[FacetHost, ...]
    carry: dict[type[Effect], Carry]
    decisions: dict[type[Effect], Callable[[Any], str | None]]


#: by the packages of a composition (``Facets.installed``), the one thing that changes them
_parts: dict[tuple[str, ...], _Parts] = {}


def _load(facets: registry.Facets | None) -> _Parts:
    facets = facets or registry.default()
    key = facets.installed
    parts = _parts.get(key)
    if parts is None:
        hosts = tuple(
            module.HOST for p in facets.plugins if (module := registry.part(p, "host")) is not None
        )
        parts = _parts[key] = _Parts(
            hosts,
            {t: h for host in hosts for t, h in host.carry.items()},
            {t: d for host in hosts for t, d in host.decisions.items()},
        )
    return parts


def facet_hosts(facets: registry.Facets | None = None) -> tuple[FacetHost, ...]:
    """Every facet's host part, in the facets' order (of ``facets``; the command line's when
    None)."""
    return _load(facets).hosts


def facet_carry(facets: registry.Facets | None = None) -> dict[type[Effect], Carry]:
    """Every facet's effect handlers, by effect type (of ``facets``, as above)."""
    return _load(facets).carry


def facet_decisions(
    facets: registry.Facets | None = None,
) -> dict[type[Effect], Callable[[Any], str | None]]:
    """Every facet's operator log lines, by effect type (of ``facets``, as above)."""
    return _load(facets).decisions
