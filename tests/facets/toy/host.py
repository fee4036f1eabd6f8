"""The toy facet's host part: each bump is an update on the group's journal, and the latest
one is what a resync sends."""

from __future__ import annotations

from foldplane.coordinator.host.facets import FacetHost
from foldplane.coordinator.host.ready import HostState, Ready
from tests.facets.toy.fold import CounterBumped
from tests.facets.toy.protocol import CounterUpdate


def _bumped(state: HostState, effect: CounterBumped, ready: Ready) -> None:
    update = CounterUpdate(offset=effect.offset, group=effect.group, count=effect.count)
    state.latest.setdefault(effect.group, {})["toy"] = update
    ready.updates.append((effect.group, None, update))


HOST = FacetHost(carry={CounterBumped: _bumped})
