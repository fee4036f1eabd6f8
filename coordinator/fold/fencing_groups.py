"""Fencing a group's creation: a name is created once; creating it again with the same
configuration repeats the creation (``fencing.repeat_of`` answers with it, nothing is
appended), another configuration under the same name is a conflict that names each field that
differs, and a group whose run is over is not created again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ...wire.codes import GROUP_CONFLICT, GROUP_ENDED, INVALID_EVENT
from ...wire.inputs import GroupCreatedInput, decode
from .config import ConfigError, GroupConfig
from .fencing_ranks import Refusal, ended_text
from .state import GroupState


def parse_group_created(created: GroupCreatedInput) -> GroupConfig:
    """The config of a ``group_created`` input ``{"world_size": N, "config": {...}}``."""
    config = {} if created.config is msgspec.UNSET else created.config
    if not isinstance(config, dict):
        raise ConfigError("config", f"must be an object, got {config!r}")
    world_size = created.world_size
    if world_size is msgspec.UNSET:
        raise ConfigError("world_size", "is required")
    if "world_size" in config and config["world_size"] != world_size:
        raise ConfigError(
            "world_size",
            f"payload says {world_size!r} but config says {config['world_size']!r}",
        )
    return GroupConfig.from_request({**config, "world_size": world_size})


def group_created_refusal(
    groups: Mapping[str, GroupState], group: str, rank: int | None, payload: dict[str, Any]
) -> Refusal | None:
    """Creating an identical group again is accepted (and changes nothing); another
    configuration under the same name is a conflict."""
    try:
        config = parse_group_created(decode("group_created", payload))  # type: ignore[arg-type]
    except ConfigError as exc:
        return INVALID_EVENT, f"group_created: {exc}"
    if rank is not None:
        return INVALID_EVENT, f"group_created must not name a rank, got rank={rank}"
    existing = groups.get(group)
    if existing is not None and existing.ended is not None:
        return GROUP_ENDED, ended_text(existing)
    if existing is not None and not same_config(existing.config, config):
        return GROUP_CONFLICT, (
            f"group {group!r} exists with another configuration "
            f"({config_diff(existing.config, config)}); creating it again must repeat it exactly"
        )
    return None


def same_config(existing: GroupConfig, config: GroupConfig) -> bool:
    """Creating a group again is the same creation when it repeats the configuration exactly."""
    return existing == config


def config_diff(existing: GroupConfig, config: GroupConfig) -> str:
    """Each field that differs, as ``field: old (existing) vs new``."""
    theirs, ours = existing.to_dict(), config.to_dict()
    return ", ".join(
        f"{k}: {theirs.get(k)!r} (existing) vs {ours.get(k)!r}"
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k)
    )
