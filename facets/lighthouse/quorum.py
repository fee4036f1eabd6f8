"""The lighthouse facet's quorum rule: torchft's ``quorum_compute``, a pure function of the
pending requests, the heartbeats and the last quorum (``fold.py``'s docstring says how the
facet feeds it and what it does with the decision).
"""

from __future__ import annotations

import msgspec

from .effects import Settings, Verdict
from .messages import QuorumMember

_MS = 1_000_000


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """A replica group's pending request: what it asked, when (``joined``, ns) and where."""

    member: QuorumMember
    joined: int
    offset: int


class LastQuorum(msgspec.Struct, frozen=True, kw_only=True):
    """The last quorum decided: its id, its participants' ids, its record and time."""

    quorum_id: int
    replica_ids: tuple[str, ...]
    offset: int
    ts: int


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`quorum_compute` decided: the participants (replica ids, sorted) or None
    when no quorum can be issued yet, and why, in torchft's words; and each replica group's
    verdict."""

    participants: tuple[str, ...] | None
    reason: str
    verdicts: tuple[Verdict, ...]


def _ms(ns: int) -> str:
    return f"{ns / _MS:.0f} ms"


def quorum_compute(
    now: int,
    requests: dict[str, Request],
    beats: dict[str, int],
    last: LastQuorum | None,
    settings: Settings,
    lost: dict[str, tuple[int, int]] | None = None,
) -> Decision:
    """torchft's quorum rule (``quorum_compute`` in its ``src/lighthouse.rs``), as a function of
    the fold's state at ``now`` (ns):

    1. A replica group is *healthy* while its last heartbeat (a request is one) is less than
       ``heartbeat_timeout_ms`` old; the *participants* are the healthy ones that asked.
    2. If a participant asked ``shrink_only``, only members of the last quorum may take part.
    3. **Fast quorum**: when every member of the last quorum is a participant again, the
       participants are the quorum at once (no waiting for anyone else).
    4. Otherwise a new quorum needs at least ``min_replicas`` participants, and more than half
       of the healthy replica groups (no split brain: two halves cannot both form one).
    5. While some healthy replica groups have not asked yet, it waits for them, until
       ``join_timeout_ms`` after the first participant asked; then the participants are the
       quorum without them.

    Every replica group it knows of gets a verdict: in, or out and why (``lost``: the
    incarnations a launcher reported dead, by id: the offset of the report and its time; those
    reported since the last quorum are named too).
    """
    timeout = settings.heartbeat_timeout_ms * _MS
    healthy = {r for r, t in beats.items() if now - t < timeout}
    participants = sorted(r for r in requests if r in healthy)
    candidates = participants
    shrink_only = any(requests[r].member.shrink_only for r in participants)
    meta = (
        f"[{len(participants)}/{len(requests)} participants healthy]"
        f"[{len(healthy)} heartbeating][shrink_only={str(shrink_only).lower()}]"
    )
    last_ids = set(last.replica_ids) if last is not None else set()
    if last is not None and shrink_only:
        candidates = [r for r in participants if r in last_ids]

    def verdicts(chosen: list[str] | None) -> tuple[Verdict, ...]:
        inside = set(chosen or ())
        out = []
        for r in sorted(set(beats) | set(requests)):
            beat = beats.get(r)
            age = f"last heartbeat {_ms(now - beat)} ago" if beat is not None else "no heartbeat"
            request = requests.get(r)
            if r in inside:
                assert request is not None
                why = (f"asked at offset {request.offset} at step {request.member.step}; "
                       f"{age}")  # fmt: skip
            elif r not in healthy:
                why = (f"{age}, past heartbeat_timeout_ms {settings.heartbeat_timeout_ms}"
                       + (f" (asked at offset {request.offset})" if request else ""))  # fmt: skip
            elif request is None:
                why = f"heartbeating ({age}) but not asking for a quorum"
            elif shrink_only and r not in last_ids:
                why = (f"asked at offset {request.offset}, but a participant asked shrink_only "
                       f"and it is not in quorum {last.quorum_id if last else '-'}")  # fmt: skip
            else:
                why = f"asked at offset {request.offset}; waiting: no quorum yet"
            out.append(Verdict(replica_id=r, included=r in inside, why=why))
        since = last.ts if last is not None else 0
        for r, (offset, at) in sorted((lost or {}).items()):
            if at >= since:
                why = f"a launcher reported it dead at offset {offset}"
                out.append(Verdict(replica_id=r, included=False, why=why))
        return tuple(out)

    if last is not None and last_ids <= set(participants):
        return Decision(
            participants=tuple(candidates),
            reason=f"Fast quorum found! {meta}",
            verdicts=verdicts(candidates),
        )
    if len(participants) < settings.min_replicas:
        return Decision(
            participants=None,
            reason=(
                f"New quorum not ready, only have {len(participants)} participants, need "
                f"min_replicas {settings.min_replicas} {meta}"
            ),  # fmt: skip
            verdicts=verdicts(None),
        )
    if len(participants) <= len(healthy) // 2:
        return Decision(
            participants=None,
            reason=(
                f"New quorum not ready, only have {len(participants)} participants, need "
                f"at least half of {len(healthy)} healthy workers {meta}"
            ),  # fmt: skip
            verdicts=verdicts(None),
        )
    first_joined = min((requests[r].joined for r in participants), default=now)
    waited = now - first_joined
    if len(participants) < len(healthy) and waited < settings.join_timeout_ms * _MS:
        return Decision(
            participants=None,
            reason=(
                f"Valid quorum with {len(participants)} participants, waiting for "
                f"{len(healthy) - len(participants)} healthy but not participating "
                f"stragglers due to join timeout {meta}"
            ),  # fmt: skip
            verdicts=verdicts(None),
        )
    return Decision(
        participants=tuple(candidates),
        reason=f"Valid quorum found {meta}",
        verdicts=verdicts(candidates),
    )
