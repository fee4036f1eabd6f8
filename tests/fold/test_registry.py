"""The facet registry (coordinator/fold/registry.py): the one list of facets every layer reads,
and what it refuses: a package that is not a facet, two facets that claim one record kind."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from foldplane.coordinator.fold import registry
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.registry import FacetPlugin
from foldplane.eventlog.record import MEMBERSHIP_KINDS, check_kinds


@pytest.fixture
def restore() -> Iterator[None]:
    before = registry.installed()
    yield
    registry.install(before)


def _package(name: str, plugin: object) -> str:
    module = types.ModuleType(name)
    module.PLUGIN = plugin  # type: ignore[attr-defined]
    sys.modules[name] = module
    return name


def test_the_fold_has_one_object_per_registered_facet_in_the_registry_order() -> None:
    m = Coordinator()
    assert [f.name for f in m.facets] == [p.name for p in registry.plugins()]
    assert [p.name for p in registry.plugins()][:2] == ["epochs", "refits"]
    assert m.facet("epochs") is m.facets[0]


def test_the_fold_takes_the_kinds_of_its_facets_and_no_other() -> None:
    assert Coordinator().composition.all_kinds == registry.all_kinds()
    assert registry.all_kinds() == MEMBERSHIP_KINDS | registry.kinds()
    assert "epoch_plan" in registry.kinds() and "epoch_plan" not in MEMBERSHIP_KINDS
    with pytest.raises(ValueError, match="not a name"):
        check_kinds({"Bad-Kind"})


def test_a_package_that_cannot_be_imported_is_named(restore: None) -> None:
    with pytest.raises(ValueError, match="tests.fold.nosuch_facet"):
        registry.install("tests.fold.nosuch_facet")
    assert registry.installed() == ()


def test_a_package_without_a_plugin_is_named(restore: None) -> None:
    name = _package("facet_without_plugin", None)
    with pytest.raises(ValueError, match="facet_without_plugin.*declares no PLUGIN"):
        registry.install(name)


def test_two_facets_may_not_claim_one_record_kind(restore: None) -> None:
    twin = FacetPlugin(name="twin", kinds=frozenset({"progress"}), fold=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="'epochs' and facet 'twin' both declare record kind"):
        registry.install(_package("facet_twin", twin))
    assert registry.installed() == ()


def test_a_facet_may_not_claim_a_kind_of_membership(restore: None) -> None:
    joiner = FacetPlugin(name="joiner", kinds=frozenset({"join"}), fold=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="'membership' and facet 'joiner'"):
        registry.Facets(_package("facet_joiner", joiner))


def test_a_facet_takes_only_agent_events_of_its_own_kinds(restore: None) -> None:
    from foldplane.wire.protocol import AgentEventBase

    class Stray(AgentEventBase, tag="stray_event", kw_only=True):
        n: int

    stray = FacetPlugin(
        name="stray",
        kinds=frozenset({"stray_kind"}),
        fold=lambda: None,  # type: ignore[arg-type,return-value]
        events=(Stray,),
    )
    with pytest.raises(ValueError, match="'stray_event'.*not one of its record kinds"):
        registry.install(_package("facet_with_stray_event", stray))
    assert "stray_event" not in registry.default().events.types


def test_the_built_in_facets_declare_the_agent_events_they_take() -> None:
    kinds = registry.default().events.kinds
    taken = {kinds[e] for p in registry.plugins() for e in p.events}
    assert {"progress", "refit_join", "refit_bootstrap", "transfer", "transfer_status"} <= taken
    assert taken <= registry.kinds()
