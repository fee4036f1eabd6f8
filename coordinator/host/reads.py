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

**Cost per cycle** (copy-on-write, per group): a group is captured again only when a record of
the cycle names it; a cycle of heartbeats alone copies only that group's last beats; a record
that names no group (a tick, a facet's record) captures every group, since a deadline may move
any of them. Every other group's read model, with whatever was rendered of it, is the previous
cycle's, shared. The proposals are copied (a dict of frozen values) when any record other than
a heartbeat was folded. ``python -m benchmarks reads`` measures it at 16,384 ranks.

A facet's reads (``facet(name)``) are its own read model, which the facet publishes with the
rest (``Facet.read_model``, ``coordinator/fold/facets.py``): an immutable value with the query
methods its routes and console panel call (``facets/<name>/reads.py``), built from the one
before, sharing what did not change (a facet notes what its steps changed). The facet's fold
object is never handed out.
"""

from __future__ import annotations

from typing import Any

from ...eventlog.record import Record
from ..fold.capture import GroupCapture, proposals_of
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
        proposals: dict[int, Proposal],
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
    """Builds each cycle's :class:`Reads` from the fold, capturing only the groups the cycle's
    records changed (see the module docstring). The host :meth:`note` s each record it folds
    and :meth:`publish` es once the cycle is carried out."""

    def __init__(self, machine: Coordinator) -> None:
        self._machine = machine
        #: groups a record named since the last publish (None: every group)
        self._named: set[str] | None = None
        #: groups heartbeat records named since then
        self._beaten: set[str] = set()
        self._proposals_moved = True
        self.current = Reads(0, {}, {}, {})
        self.publish()

    def note(self, record: Record) -> None:
        """A record the fold just stepped: what it may have changed."""
        group = record.group
        if record.kind == "heartbeat":
            if group is not None:
                self._beaten.add(group)
            return
        self._proposals_moved = True
        named = self._named
        if named is None:
            return
        if group is None:
            self._named = None
        else:
            named.add(group)

    def publish(self) -> Reads:
        """The read model of the fold as it stands now; ``current`` from now on."""
        machine = self._machine
        before = self.current._groups  # noqa: SLF001 - the publisher builds Reads
        named, beaten = self._named, self._beaten
        groups: dict[str, GroupReads] = {}
        for name, g in machine.group_states.items():
            old = before.get(name)
            if old is None or named is None or name in named:
                groups[name] = GroupReads(GroupCapture(g))
            elif name in beaten:
                groups[name] = GroupReads(old.capture.with_beats(g))
            else:
                groups[name] = old
        proposals = (
            dict(proposals_of(machine)) if self._proposals_moved else self.current._proposals  # noqa: SLF001
        )
        facets_before = self.current._facets  # noqa: SLF001
        facets = {f.name: f.read_model(facets_before.get(f.name)) for f in machine.facets}
        self.current = Reads(machine.offset, groups, proposals, facets)
        self._named, self._beaten, self._proposals_moved = set(), set(), False
        return self.current
