"""View rows: a committed view is stored as a delta from the version before it when one
serves, as the full view otherwise (coordinator/fold/projections.py, "View rows").

A twin test per guard of the choice (first version, checkpoint, a gap in versions, a delta no
smaller than the full view, a delta that would not rebuild the view), the size of a 16,384-rank
view change, and a property: any sequence of views, folded from any full row, gives back
exactly the full views.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldplane.coordinator.fold.effects import HEALTHY, OFFLINE, SYNCED, View, ViewCommitted
from foldplane.coordinator.fold.projections import (
    DELTA_FROM,
    VIEW_CHECKPOINT_EVERY,
    ViewFold,
    ViewRowError,
    is_delta,
    is_view_checkpoint,
    rows_for,
    view_checkpoint_at,
    view_doc,
    view_row,
)
from foldplane.eventlog import ProjectionRow
from tests.fold.script import Script, of, one

K = VIEW_CHECKPOINT_EVERY


def make_view(
    version: int,
    world_size: int,
    *,
    active: tuple[int, ...] | None = None,
    states: dict[int, str] | None = None,
    healthy: tuple[int, ...] | None = None,
    acked: tuple[int, ...] = (),
    dropped: tuple[int, ...] = (),
    group: str = "g",
) -> View:
    every = tuple(range(world_size))
    return View(
        group=group,
        version=version,
        active_ranks=every if active is None else active,
        rank_states=states if states is not None else dict.fromkeys(every, HEALTHY),
        healthy_set=every if healthy is None else healthy,
        cause={"kind": "proposal", "proposals": [version * 10], "detail": f"v{version}"},
        acked_ranks=acked,
        dropped_ranks=dropped,
        offset=version * 100,
        ts=version * 1_000_000,
    )


def without(view: View, rank: int, version: int) -> View:
    """``view``'s successor: ``rank`` failed and left the active ranks and the Healthy Set."""
    return msgspec.structs.replace(
        view,
        version=version,
        active_ranks=tuple(r for r in view.active_ranks if r != rank),
        rank_states={**view.rank_states, rank: OFFLINE},
        healthy_set=tuple(r for r in view.healthy_set if r != rank),
        cause={"kind": "auto_deactivation", "proposals": [], "detail": f"rank {rank} failed"},
        acked_ranks=tuple(r for r in view.active_ranks if r != rank),
        dropped_ranks=(rank,),
        offset=version * 100,
        ts=version * 1_000_000,
    )


def size(doc: dict[str, Any]) -> int:
    return len(msgspec.json.encode(doc))


def fold(rows: list[ProjectionRow]) -> list[dict[str, Any]]:
    f = ViewFold()
    return [f.add(row) for row in rows]  # type: ignore[misc]


def test_a_view_change_of_16384_ranks_is_stored_as_a_delta_of_a_few_hundred_bytes() -> None:
    base = make_view(1, 16_384)
    view = without(base, 5, 2)
    row = view_row(view, base)
    assert row.kind == "view" and row.group == "g" and row.seq == 2
    assert is_delta(row.doc) and row.doc[DELTA_FROM] == 1
    assert size(row.doc) < 1000
    assert size(view_doc(view)) > 200_000  # what the row was before: the whole view
    assert fold([view_row(base, None), row])[1] == view_doc(view)


def test_the_first_version_of_a_group_is_a_full_row() -> None:
    first = make_view(1, 8)
    assert view_row(first, None).doc == view_doc(first)
    # its twin: the same view after another one is a delta
    assert is_delta(view_row(without(first, 3, 2), first).doc)


def test_every_kth_version_is_a_full_row_so_a_reader_folds_at_most_k_minus_1_deltas() -> None:
    assert [v for v in range(1, 3 * K + 1) if is_view_checkpoint(v)] == [1, K + 1, 2 * K + 1]
    assert view_checkpoint_at(K) == 1 and view_checkpoint_at(K + 1) == K + 1
    assert view_checkpoint_at(2 * K) == K + 1
    views = [make_view(1, 64)]
    for v in range(2, 2 * K + 3):
        views.append(without(views[-1], v % 64, v) if v % 2 else make_view(v, 64))
    rows = [view_row(v, b) for v, b in zip(views, [None, *views[:-1]], strict=True)]
    full = [r.seq for r in rows if not is_delta(r.doc)]
    assert full == [1, K + 1, 2 * K + 1]
    assert fold(rows) == [view_doc(v) for v in views]
    # from a checkpoint on, a fold needs nothing before it
    assert fold(rows[K:]) == [view_doc(v) for v in views[K:]]


def test_a_base_that_is_not_the_version_before_gives_a_full_row() -> None:
    base = make_view(1, 8)
    assert view_row(without(base, 3, 3), base).doc == view_doc(without(base, 3, 3))
    assert is_delta(view_row(without(base, 3, 2), base).doc)


def test_a_delta_no_smaller_than_the_full_view_gives_a_full_row() -> None:
    # one rank: the full view is as short as any delta of it
    base = make_view(1, 1)
    view = make_view(2, 1, states={0: SYNCED}, active=(), healthy=())
    row = view_row(view, base)
    assert not is_delta(row.doc) and row.doc == view_doc(view)
    # its twin: the same change in a group of 64 is a delta
    big = make_view(1, 64)
    assert is_delta(view_row(without(big, 0, 2), big).doc)


def test_a_view_a_delta_cannot_rebuild_gives_a_full_row() -> None:
    # a delta's rank sets come back sorted; a view whose active ranks are not would not
    base = make_view(1, 16)
    odd = msgspec.structs.replace(without(base, 3, 2), active_ranks=(2, 1, 0))
    assert view_row(odd, base).doc == view_doc(odd)
    # nor would a view whose rank_states names a rank the base does not have
    grown = msgspec.structs.replace(
        without(base, 3, 2), rank_states={**base.rank_states, 16: HEALTHY}
    )
    assert view_row(grown, base).doc == view_doc(grown)
    # the twin: sorted, over the same ranks, it is a delta
    assert is_delta(view_row(without(base, 3, 2), base).doc)


def test_the_fold_hands_each_committed_view_its_predecessor() -> None:
    s = Script()
    first = one(s.form(world_size=4), ViewCommitted)
    assert first.base is None
    s.propose("deactivate", [3])
    second = one(s.ack_all(), ViewCommitted)
    assert second.base == first.view and second.view.version == 2
    rows = [r for e in (first, second) for r in rows_for(e)]
    assert [is_delta(r.doc) for r in rows] == [False, True]
    assert fold(rows) == [view_doc(first.view), view_doc(second.view)]
    s.propose("activate", [3])
    third = one(s.ack_all(), ViewCommitted)
    assert third.base == second.view and of([third], ViewCommitted)[0].view.version == 3


def test_a_delta_without_its_base_does_not_fold_and_says_which_row() -> None:
    base = make_view(1, 8)
    v2 = without(base, 3, 2)
    v3 = without(v2, 4, 3)
    rows = [view_row(base, None), view_row(v2, base), view_row(v3, v2)]
    with pytest.raises(ViewRowError, match=r"view g/2: a delta from version 1 with no full row"):
        fold(rows[1:])
    with pytest.raises(ViewRowError, match=r"view g/3: a delta from version 2 .* version 1"):
        fold([rows[0], rows[2]])  # version 2 missing
    broken = ProjectionRow("view", "g", 2, {**rows[1].doc, "active_ranks": {"remove": [99]}})
    with pytest.raises(ViewRowError, match=r"view g/2: the delta does not apply"):
        fold([rows[0], broken])
    # the twin: the rows as written fold
    assert fold(rows) == [view_doc(v) for v in (base, v2, v3)]


STATES = (HEALTHY, SYNCED, OFFLINE)


@st.composite
def view_sequences(draw: st.DrawFn) -> list[View]:
    n = draw(st.integers(min_value=1, max_value=40))
    length = draw(st.integers(min_value=1, max_value=2 * K + 10))
    ranks = st.lists(st.integers(0, n - 1), max_size=n).map(lambda rs: tuple(sorted(set(rs))))
    states = dict.fromkeys(range(n), HEALTHY)
    views: list[View] = []
    for version in range(1, length + 1):
        for rank in draw(st.lists(st.integers(0, n - 1), max_size=4)):
            states[rank] = draw(st.sampled_from(STATES))
        views.append(
            View(
                group="g",
                version=version,
                active_ranks=draw(ranks),
                rank_states=dict(states),
                healthy_set=draw(ranks),
                cause={
                    "kind": draw(st.sampled_from(["formation", "proposal", "auto_deactivation"])),
                    "proposals": draw(st.lists(st.integers(1, 10**6), max_size=3)),
                    "detail": draw(st.text(max_size=20)),
                },
                acked_ranks=draw(ranks),
                dropped_ranks=draw(ranks),
                offset=version * 7 + draw(st.integers(0, 6)),
                ts=draw(st.integers(0, 2**62)),
            )
        )
    return views


@settings(max_examples=60, deadline=None)
@given(views=view_sequences(), data=st.data())
def test_any_sequence_of_views_folds_back_to_the_full_views_from_any_full_row(
    views: list[View], data: st.DataObject
) -> None:
    rows = [view_row(v, b) for v, b in zip(views, [None, *views[:-1]], strict=True)]
    for row, view in zip(rows, views, strict=True):
        if is_view_checkpoint(view.version):
            assert row.doc == view_doc(view)
        elif is_delta(row.doc):
            assert size(row.doc) < size(view_doc(view))
        else:
            assert row.doc == view_doc(view)
    assert fold(rows) == [view_doc(v) for v in views]
    # a reader that wants version v starts at the nearest full row at or before it
    v = data.draw(st.integers(1, len(views)))
    start = max(r.seq for r in rows[:v] if not is_delta(r.doc))
    assert v - start < K
    assert fold(rows[start - 1 : v]) == [view_doc(x) for x in views[start - 1 : v]]
