"""The refit panel of ``replay --plot`` (coordinator/plot.py): what it gathers from the real fold
of a scripted log (each epoch's status changes, each transfer attempt from its start to how it
ended) and that it is drawn below the view history. Set
``FOLDPLANE_REFIT_PLOT=docs/replay-plot-refit.png`` to keep the picture docs/console.md shows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from PIL import Image

from foldplane.coordinator.fold.effects import ViewCommitted
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.plot import Timeline, plot_views
from foldplane.facets.refits.plot import (
    ADMITTED_COLOUR,
    TRANSFER_COLOURS,
    RefitPanel,
    TransferSpan,
)
from tests.fold.script import T0, S
from tests.fold.test_refit_story import scenario


def folded(group: str | None = None) -> tuple[Timeline, list[dict[str, Any]]]:
    """The panel's data, and the view documents replay would report, from one fold."""
    s = scenario()
    timeline = Timeline(group)
    hook = timeline.fresh()
    m = Coordinator()
    views: list[dict[str, Any]] = []
    for record in s.records:
        effects = m.step(record)
        hook(record, effects, m)
        for e in effects:
            if isinstance(e, ViewCommitted):
                v = e.view
                views.append(
                    {
                        "group": v.group,
                        "version": v.version,
                        "ts": record.ts,
                        "active_ranks": list(v.active_ranks),
                        "cause": v.cause,
                    }
                )
    return timeline, views


def gathered(group: str | None = None) -> RefitPanel:
    return folded(group)[0].panel("refits")


def test_the_refit_panel_gathers_epochs_and_transfer_attempts():
    lane = gathered().refits["rl"]
    assert lane.groups == ("train", "gen")
    assert [(epoch, status) for _, epoch, status, _ in lane.epochs] == [
        (1, "waiting"),
        (1, "admitted"),
        (2, "waiting"),
        (3, "waiting"),
        (4, "waiting"),
        (4, "admitted"),
    ]
    failed, retried = lane.transfers
    assert (failed.key, failed.attempt, failed.status) == ("step-1", 1, "failed")
    assert "subscriber slot 2 (gen rank 2) went OFFLINE" in failed.detail
    assert failed.end == T0 + 3 * S  # the death report
    assert (retried.attempt, retried.status) == (2, "completed")
    assert retried.start >= T0 + 5 * S and retried.end is not None
    # the second epoch began at the loss, when the first attempt failed
    assert lane.epochs[2][0] == failed.end


def test_a_group_asked_for_keeps_only_the_refits_over_it():
    assert set(gathered("gen").refits) == {"rl"}
    assert gathered("other").refits == {}


def test_a_running_attempt_has_no_end_yet():
    span = TransferSpan("k", 1, T0)
    assert span.end is None and span.status == "running"


def test_the_refit_panel_is_drawn_below_the_views(tmp_path: Path):
    timeline, views = folded()
    with_refits = tmp_path / "with.png"
    plot_views(views, str(with_refits), timeline)
    without = tmp_path / "without.png"
    plot_views(views, str(without), folded("other")[0])
    tall, short = Image.open(with_refits), Image.open(without)
    assert tall.width == short.width and tall.height > short.height
    # the admitted epochs and both attempts' bars are drawn, not just the axes
    colours = dict((c, n) for n, c in tall.convert("RGB").getcolors(maxcolors=1 << 16) or [])
    for name, hex_colour in (
        ("admitted", ADMITTED_COLOUR),
        ("completed", TRANSFER_COLOURS["completed"]),
        ("failed", TRANSFER_COLOURS["failed"]),
    ):
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        assert colours.get(rgb, 0) > 20, f"no {name} drawn"
    keep = os.environ.get("FOLDPLANE_REFIT_PLOT")  # docs/replay-plot-refit.png
    if keep:
        plot_views(views, keep, timeline)
    svg = tmp_path / "with.svg"
    plot_views(views, str(svg), timeline)
    text = svg.read_text()
    assert "refits: epochs and transfers" in text and "step-1 #1 failed" in text
    assert "rl (train -&gt; gen)" in text and "e4" in text
