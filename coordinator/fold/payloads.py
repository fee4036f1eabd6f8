"""Shape checks for record payloads: the ``invalid_event`` rules, one function per kind.

Each check returns ``None`` when the payload is well formed, or a message naming the field that
is missing or has the wrong type. Checks that need the group (ranks in range, current
incarnation, version in flight) live with the fold; these only need the payload and the group's
world size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...wire import ranks as rank_sets
from ...wire.ranks import RankSetError

MAX_ID_LEN = 256
RECONFIGURE = "reconfigure"
OPS = ("activate", "deactivate", RECONFIGURE)
#: A reconfigure's uuid is torch's ``ReconfigureOptions.uuid``: a signed 64-bit integer.
UUID_RANGE = (-(2**63), 2**63)
#: The longest a reconfigure may wait to be admitted (``timeout_s``), as for every duration.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: The fields only a reconfigure carries.
RECONFIGURE_FIELDS = ("incarnations", "uuid", "caller", "call", "timeout_s")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(payload: dict[str, Any], name: str, *, required: bool) -> str | None:
    if name not in payload or (payload[name] is None and not required):
        return f"{name} is required" if required else None
    value = payload[name]
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LEN:
        return (
            f"{name} must be a non-empty string of at most {MAX_ID_LEN} characters, got {value!r}"
        )
    return None


def _optional_int(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is not None and (not _is_int(value) or value < 0):
        return f"{name} must be a non-negative integer, got {value!r}"
    return None


def check_join(payload: dict[str, Any], world_size: int) -> str | None:
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    if "host" in payload and payload["host"] is not None and not isinstance(payload["host"], str):
        return f"host must be a string, got {payload['host']!r}"
    return _optional_int(payload, "pid")


def check_heartbeat(payload: dict[str, Any], world_size: int) -> str | None:
    """One rank's beat (``incarnation``, from an older log), or the beats of many ranks that
    arrived together, sharing one record: ``ranks``, a rank set (``wire.ranks``)."""
    if "ranks" in payload:
        if "incarnation" in payload:
            return "a shared heartbeat record names ranks, not an incarnation"
        return _rank_set(payload, "ranks", world_size)
    return _text(payload, "incarnation", required=True) or _optional_int(payload, "version")


def _rank_set(payload: dict[str, Any], name: str, world_size: int) -> str | None:
    try:
        rank_sets.decode(payload[name], world_size, name=name)
    except RankSetError as exc:
        return str(exc)
    return None


def check_ack(payload: dict[str, Any], world_size: int) -> str | None:
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    version = payload.get("version")
    if not _is_int(version) or version < 1:
        return f"version must be a positive integer, got {version!r}"
    return None


def check_exit(payload: dict[str, Any], world_size: int) -> str | None:
    return _text(payload, "incarnation", required=True)


def check_death(payload: dict[str, Any], world_size: int) -> str | None:
    return _text(payload, "incarnation", required=False) or _text(
        payload, "reporter", required=False
    )


def check_links(payload: dict[str, Any], world_size: int) -> str | None:
    """A links report: ``down`` and ``hint`` rank sets (protocol 2), or, in records of an
    older log, ``peers`` {rank: "up"|"down"} and a ``failed_ranks_hint`` list."""
    if (err := _text(payload, "incarnation", required=True)) is not None:
        return err
    ready = payload.get("self_ready")
    if not isinstance(ready, bool):
        return f"self_ready must be true or false, got {ready!r}"
    legacy = "peers" in payload or "failed_ranks_hint" in payload
    if legacy and ("down" in payload or "hint" in payload):
        return "a links report carries down/hint or (protocol 1) peers/failed_ranks_hint, not both"
    if legacy:
        err = _check_legacy_links(payload, world_size)
    else:
        err = next(
            (
                e
                for n in ("down", "hint")
                if n in payload and (e := _rank_set(payload, n, world_size))
            ),
            None,
        )
    return err or _optional_int(payload, "version") or _optional_int(payload, "reached")


def _check_legacy_links(payload: dict[str, Any], world_size: int) -> str | None:
    peers = payload.get("peers", {})
    if not isinstance(peers, dict):
        return f"peers must be an object of rank -> 'up'|'down', got {peers!r}"
    if not _plainly_good_peers(peers, world_size) and (err := _check_each_peer(peers, world_size)):
        return err
    hint = payload.get("failed_ranks_hint")
    if hint is not None:
        if not isinstance(hint, list):
            return f"failed_ranks_hint must be a list of ranks, got {hint!r}"
        bad = [r for r in hint if not _is_int(r) or not 0 <= r < world_size]
        if bad:
            return f"failed_ranks_hint names {bad!r}, not ranks in 0..{world_size - 1}"
    return None


_STATUSES = frozenset({"up", "down"})
#: world size -> the rank keys a peers map may use, as decimal strings ("0", "1", ...).
_rank_keys: dict[int, frozenset[str]] = {}


def _plainly_good_peers(peers: dict[Any, Any], world_size: int) -> bool:
    """The common case decided by two set comparisons in C: every key a plain decimal rank of
    the group, every value 'up' or 'down'. A full links report names every other rank, so a
    rank-by-rank loop here would cost a 512-rank group about a third of a millisecond per
    report. False sends the report to the rank-by-rank check, which words the error (and
    decides the rare spellings this test does not know, like "007")."""
    keys = _rank_keys.get(world_size)
    if keys is None:
        if len(_rank_keys) >= 64:
            _rank_keys.clear()
        keys = _rank_keys[world_size] = frozenset(map(str, range(world_size)))
    try:
        return peers.keys() <= keys and _STATUSES.issuperset(peers.values())
    except TypeError:  # an unhashable value
        return False


def _check_each_peer(peers: dict[Any, Any], world_size: int) -> str | None:
    for key, value in peers.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < world_size):
            return f"peers key {key!r} is not a rank in 0..{world_size - 1}"
        if value not in ("up", "down"):
            return f"peers[{key!r}] must be 'up' or 'down', got {value!r}"
    return None


def check_proposal(payload: dict[str, Any], world_size: int) -> str | None:
    """Malformed proposals are refused; well-formed ones naming bad ranks are logged and
    rejected later (so audits see them), hence ranks are not range-checked here.

    A ``reconfigure`` (torch's ``ProcessGroup.reconfigure``, one member's call) also carries
    ``incarnations`` (one per rank, in the same order: the members' handles), ``uuid`` (an
    integer), ``caller`` (the member whose call this is, an integer), an optional ``call``
    (the id of this call of the member: the same id again is the same call, sent again) and an
    optional ``timeout_s``; it takes no ``idempotency_key``. The other ops carry none of those
    fields."""
    op = payload.get("op")
    if op not in OPS:
        return f"op must be one of {list(OPS)}, got {op!r}"
    ranks = payload.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return f"ranks must be a non-empty list of ranks, got {ranks!r}"
    bad = [r for r in ranks if not _is_int(r)]
    if bad:
        return f"ranks must be integers; got {bad!r}"
    if len(ranks) > 65_536:
        return f"ranks names {len(ranks)} ranks; at most 65536"
    err = _text(payload, "proposer", required=False) or _text(
        payload, "idempotency_key", required=False
    )
    if err is not None:
        return err
    if op == RECONFIGURE:
        return _check_reconfigure(payload, ranks)
    extra = [name for name in RECONFIGURE_FIELDS if name in payload]
    if extra:
        return f"{', '.join(extra)} belong to a reconfigure, not to {op}"
    return None


def _check_reconfigure(payload: dict[str, Any], ranks: list[int]) -> str | None:
    if payload.get("idempotency_key") is not None:
        return "a reconfigure takes no idempotency_key: its uuid is its key"
    incarnations = payload.get("incarnations")
    if not isinstance(incarnations, list) or len(incarnations) != len(ranks):
        return (
            f"incarnations must be a list of {len(ranks)} incarnations, one per rank in the "
            f"order of ranks, got {incarnations!r}"
        )
    for i, inc in enumerate(incarnations):
        if not isinstance(inc, str) or not inc or len(inc) > MAX_ID_LEN:
            return (
                f"incarnations[{i}] must be a non-empty string of at most {MAX_ID_LEN} "
                f"characters, got {inc!r}"
            )
    uuid = payload.get("uuid")
    lo, hi = UUID_RANGE
    if not _is_int(uuid) or not lo <= uuid < hi:
        return f"uuid must be a signed 64-bit integer, got {uuid!r}"
    caller = payload.get("caller")
    if not _is_int(caller):
        return f"caller must be the calling member's rank, got {caller!r}"
    if (err := _text(payload, "call", required=False)) is not None:
        return err
    timeout = payload.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        return f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {timeout!r}"
    return None


def check_group_ended(payload: dict[str, Any], world_size: int) -> str | None:
    """``{"reason"?: text, "delete"?: bool}``."""
    if "delete" in payload and not isinstance(payload["delete"], bool):
        return f"delete must be true or false, got {payload['delete']!r}"
    return _text(payload, "reason", required=False)


CHECKS: dict[str, Callable[[dict[str, Any], int], str | None]] = {
    "group_ended": check_group_ended,
    "join": check_join,
    "heartbeat": check_heartbeat,
    "ack": check_ack,
    "exit": check_exit,
    "death_reported": check_death,
    "links": check_links,
    "proposal": check_proposal,
}
