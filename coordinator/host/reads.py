"""The read model: what the API reads of the fold, as the host publishes it once per cycle.

The API never reads the fold (``coordinator/fold/machine.py``): it reads ``host.reads``, a
:class:`Reads` that the host publishes (:class:`ReadsPublisher`) each time a cycle's records are
folded and carried out (their projection rows written, their updates published), and the import
contracts forbid the API's modules to import the fold's state and rules. A request therefore
sees whole cycles only: while a cycle is between its step and the end of its carry-out (the
rows' write is awaited), ``host.reads`` is still the previous cycle's. Nothing in a
:class:`Reads` changes once published: every answer is plain data or a frozen value (a
``View``, a ``Proposal``, a ``GroupConfig``) rendered from a captured group
(``coordinator/fold/capture.py``), and a composite answer (a group's status, the group list, the
console's overview) is rendered once, when first asked, and shared by every later reader (who
never edits it).

**Cost per cycle** (copy-on-write, proportional to what the cycle changed): the fold notes what
its steps changed (``capture.FoldChanges``) and only that is captured again. A group is
captured again when a record of the cycle named it or a tick's deadline for it fell due (every
group on a resumed tick); a cycle of heartbeats alone copies only that group's last beats; a
facet's record and a tick with nothing due capture no group. Every other group's read model,
with whatever was rendered of it, is the previous cycle's, shared. The proposals are pages of
ids (``capture.ProposalPages``): a written proposal copies its page and the page table, every
other page is shared. ``python -m benchmarks reads`` measures it at 16,384 ranks.

A facet's reads (``facet(name)``) are its own read model, which the facet publishes with the
rest (``Facet.read_model``, ``coordinator/fold/facets.py``): an immutable value with the query
methods its routes and console panel call (``facets/<name>/reads.py``), built from the one
before, sharing what did not change (a facet notes what its steps changed). The facet's fold
object is never handed out.
"""

from __future__ import annotations

from typing import Any

from ..fold.capture import GroupCapture, ProposalPages, proposals_of
from ..fold.config import GroupConfig
from ..fold.effects import Proposal, View
from ..fold.machine import Coordinator
from ..fold.overview import group_line, group_overview
from ..fold.status import group_status


class GroupReads:
    """One group's read model: its capture, and what was rendered of it (once, when asked)."""

    __slots__ = ("capture", "_status", "_line")

    def __init__(self, capture: GroupCapture) -> None:
        self.capture = capture
        self._status: dict[str, Any] | None = None
        self._line: dict[str, Any] | None = None

    def status(self) -> dict[str, Any]:
        if self._status is None:
            self._status = group_status(self.capture)
        return self._status

    def line(self) -> dict[str, Any]:
        if self._line is None:
            self._line = group_line(self.capture)
        return self._line


class Reads:
    """The fold as of one cycle, as the API reads it (see the module docstring)."""

    def __init__(
        self,
        offset: int,
        groups: dict[str, GroupReads],
        proposals: ProposalPages,
        facets: dict[str, Any],
    ) -> None:
        self._offset = offset
        self._groups = groups
        self._names = sorted(groups)
        self._proposals = proposals
        self._facets = facets
        self._list: list[dict[str, Any]] | None = None
        self._overviews: dict[str, dict[str, Any]] = {}

    @property
    def offset(self) -> int:
        """The offset of the last record folded into this read model."""
        return self._offset

    def groups(self) -> list[str]:
        return list(self._names)

    def _capture(self, group: str) -> GroupCapture | None:
        got = self._groups.get(group)
        return None if got is None else got.capture

    def group_deleted(self, group: str) -> bool:
        """Whether ``group`` was ended and deleted (gone from listings and the server's limits;
        its history stays readable)."""
        g = self._capture(group)
        return g is not None and g.deleted

    def group_config(self, group: str) -> GroupConfig | None:
        g = self._capture(group)
        return None if g is None else g.config

    def current_view(self, group: str) -> View | None:
        g = self._capture(group)
        return None if g is None else g.view

    def proposal(self, id: int) -> Proposal | None:
        return self._proposals.get(id)

    def proposal_by_uuid(self, group: str, uuid: int) -> Proposal | None:
        """The reconfigure proposal of ``group`` that ``uuid`` names, if any."""
        g = self._capture(group)
        pid = None if g is None else g.uuids.get(uuid)
        return None if pid is None else self._proposals.get(pid)

    def group_status(self, group: str) -> dict[str, Any] | None:
        """``GET /groups/{group}``'s data (None: no such group)."""
        got = self._groups.get(group)
        return None if got is None else got.status()

    def group_list(self) -> list[dict[str, Any]]:
        """One line per group that was not deleted (``GET /groups``, the console)."""
        if self._list is None:
            groups = self._groups
            self._list = [
                groups[name].line() for name in self._names if not groups[name].capture.deleted
            ]
        return self._list

    def group_overview(self, group: str) -> dict[str, Any] | None:
        """The console's picture of one group (None: no such group)."""
        got = self._overviews.get(group)
        if got is None:
            g = self._capture(group)
            if g is None:
                return None
            got = self._overviews[group] = group_overview(g, self._offset, self._proposals)
        return got

    def facet(self, name: str) -> Any:
        """The facet ``name``'s read model of this cycle, for its query methods (KeyError:
        no facet of that name)."""
        got = self._facets.get(name)
        if got is None:
            raise KeyError(f"no facet named {name!r}")
        return got


class ReadsPublisher:
    """Builds each cycle's :class:`Reads` from the fold, capturing only what the cycle's
    records changed (``capture.FoldChanges``; see the module docstring). The host
    :meth:`publish` es once the cycle is carried out. The first model, made when the
    publisher is, is captured whole."""

    def __init__(self, machine: Coordinator) -> None:
        self._machine = machine
        self.current = Reads(0, {}, ProposalPages({}, 0), {})
        self.current = self._capture_whole()

    def _capture_whole(self) -> Reads:
        machine = self._machine
        groups = {name: GroupReads(GroupCapture(g)) for name, g in machine.group_states.items()}
        proposals = ProposalPages.of(proposals_of(machine))
        facets = {}
        for f in machine.facets:
            if not callable(getattr(f, "read_model", None)):
                raise TypeError(
                    f"facet {f.name!r} publishes no read model: its fold object has no "
                    "read_model (coordinator/fold/facets.py, Facet.read_model)"
                )
            facets[f.name] = f.read_model(None)
        return Reads(machine.offset, groups, proposals, facets)

    def publish(self) -> Reads:
        """The read model of the fold as it stands now; ``current`` from now on."""
        machine = self._machine
        before = self.current
        changed = machine.changes.take()
        states = machine.group_states
        groups = before._groups  # noqa: SLF001 - the publisher builds Reads
        if changed.groups or changed.beaten:
            groups = dict(groups)
            for name in changed.groups:
                g = states.get(name)
                if g is not None:
                    groups[name] = GroupReads(GroupCapture(g))
            for name in changed.beaten - changed.groups:
                old, g = groups.get(name), states.get(name)
                if old is not None and g is not None:
                    groups[name] = GroupReads(old.capture.with_beats(g))
        proposals = before._proposals.with_written(proposals_of(machine), changed.proposals)  # noqa: SLF001
        facets_before = before._facets  # noqa: SLF001
        facets = {f.name: f.read_model(facets_before.get(f.name)) for f in machine.facets}
        self.current = Reads(machine.offset, groups, proposals, facets)
        return self.current
