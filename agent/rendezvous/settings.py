"""What a torchrun command line asks of foldplane's rendezvous, read once and checked.

torchrun hands its rendezvous handler a ``RendezvousParameters``: ``--rdzv-endpoint`` (here
the coordinator's URL, or several comma-separated, as ``FOLDPLANE_COORDINATOR`` takes them),
``--rdzv-id`` (the job), ``--nnodes MIN:MAX`` and ``--rdzv-conf key=value,...``. The keys this
backend reads have torch's names where torch has one:

=========================  ========  =====================================================
``--rdzv-conf`` key        default   meaning
=========================  ========  =====================================================
``token``                  (env)     the coordinator's operator token; else
                                     ``$FOLDPLANE_TOKEN`` (better: torchrun prints its
                                     ``--rdzv-conf`` in its log, and ``ps`` shows it)
``last_call_timeout``      30        seconds a first round waits for more nodes once
                                     ``MIN`` joined (torch's name and default)
``join_timeout``           600       seconds a node waits for its round (torch's)
``close_timeout``          30        seconds to close the rendezvous at shutdown (torch's)
``keep_alive_interval``    1         seconds between a node's keep-alives (torch: 5)
``keep_alive_max_attempt`` 5         keep-alives missed before the node is lost (torch: 3)
``read_timeout``           60        seconds a store operation waits (torch's c10d name)
``local_world_size``       (argv)    the node's workers, for the log; else torchrun's
                                     ``--nproc-per-node`` when it is a number
=========================  ========  =====================================================

``timeout`` is torch's legacy whole-rendezvous timeout, which torchrun's launcher always adds
(900 s): this backend reads ``join_timeout`` instead and ignores it. Any other key is refused,
naming the ones above: a misspelt key would otherwise be ignored.
The store of a round listens on this node's ``--local-addr`` (torchrun's), else its FQDN.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client import parse_addresses, start_timeout_s

#: What a job's id must match (the coordinator's rule: ``facets/rendezvous``).
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_JOB = re.compile(JOB_PATTERN)

#: ``--rdzv-conf`` keys with their defaults (seconds, or counts).
DEFAULTS: dict[str, float] = {
    "last_call_timeout": 30.0,
    "join_timeout": 600.0,
    "close_timeout": 30.0,
    "keep_alive_interval": 1.0,
    "keep_alive_max_attempt": 5,
    "read_timeout": 60.0,
}
KNOWN_KEYS = ("token", *DEFAULTS, "local_world_size")
#: Keys torchrun's launcher adds itself, which this backend does not read.
IGNORED_KEYS = ("timeout",)


class SettingsError(ValueError):
    """A torchrun command line this backend cannot run: the message says what to change."""


@dataclass(frozen=True)
class RendezvousSettings:
    """One node's rendezvous, as its torchrun command line asks for it."""

    addresses: tuple[str, ...]
    job: str
    min_nodes: int
    max_nodes: int
    token: str | None
    store_host: str
    local_world_size: int
    last_call_s: float = DEFAULTS["last_call_timeout"]
    join_timeout_s: float = DEFAULTS["join_timeout"]
    close_timeout_s: float = DEFAULTS["close_timeout"]
    keepalive_interval_s: float = DEFAULTS["keep_alive_interval"]
    keepalive_attempts: int = int(DEFAULTS["keep_alive_max_attempt"])
    read_timeout_s: float = DEFAULTS["read_timeout"]
    #: how long the first call waits for a coordinator to answer (a wrong address fails fast)
    start_timeout_s: float = 10.0

    @property
    def keepalive_timeout_s(self) -> float:
        """A node silent this long is lost (``keep_alive_interval * keep_alive_max_attempt``)."""
        return self.keepalive_interval_s * self.keepalive_attempts

    def join_settings(self) -> dict[str, Any]:
        """The settings every join carries (the job's first join fixes them)."""
        return {
            "min_nodes": self.min_nodes,
            "max_nodes": self.max_nodes,
            "last_call_s": self.last_call_s,
            "join_timeout_s": self.join_timeout_s,
            "keepalive_timeout_s": self.keepalive_timeout_s,
        }


def settings_from(
    params: Any,
    *,
    env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> RendezvousSettings:
    """Read torchrun's ``RendezvousParameters`` (``endpoint``, ``run_id``, ``min_nodes``,
    ``max_nodes``, ``local_addr``, ``config``); raise :class:`SettingsError` naming what is
    wrong."""
    env = os.environ if env is None else env
    config: dict[str, Any] = dict(params.config)
    unknown = sorted(k for k in config if k not in KNOWN_KEYS and k not in IGNORED_KEYS)
    if unknown:
        raise SettingsError(
            f"--rdzv-conf {', '.join(unknown)}: not a key of the foldplane rendezvous backend "
            f"(it reads {', '.join(KNOWN_KEYS)}; docs/torchrun.md)"
        )
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise SettingsError(
            "--rdzv-endpoint is required: the coordinator's URL, or several comma-separated "
            "(http://coord-1:8470,http://coord-2:8470)"
        )
    items = [e.strip() for e in endpoint.split(",") if e.strip()]
    urls = [e if "://" in e else f"http://{e}" for e in items]
    try:
        addresses = tuple(parse_addresses(urls))
    except ValueError as exc:
        raise SettingsError(f"--rdzv-endpoint {endpoint!r}: {exc}") from None
    job = str(params.run_id)
    if not _JOB.fullmatch(job):
        raise SettingsError(
            f"--rdzv-id {job!r} is not a foldplane rendezvous id: 1-128 of A-Z a-z 0-9 _ . : -, "
            "starting with a letter or digit"
        )
    values = {key: _number(config, key, default) for key, default in DEFAULTS.items()}
    attempts = values["keep_alive_max_attempt"]
    if attempts != int(attempts) or attempts < 1:
        raise SettingsError(f"--rdzv-conf keep_alive_max_attempt={attempts:g}: a whole number >= 1")
    token = config.get("token") or env.get("FOLDPLANE_TOKEN") or None
    try:
        start = start_timeout_s()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return RendezvousSettings(
        addresses=addresses,
        job=job,
        min_nodes=int(params.min_nodes),
        max_nodes=int(params.max_nodes),
        token=token,
        store_host=params.local_addr or socket.getfqdn(),
        local_world_size=_local_world_size(config, argv),
        last_call_s=values["last_call_timeout"],
        join_timeout_s=values["join_timeout"],
        close_timeout_s=values["close_timeout"],
        keepalive_interval_s=values["keep_alive_interval"],
        keepalive_attempts=int(attempts),
        read_timeout_s=values["read_timeout"],
        start_timeout_s=start,
    )


def _number(config: Mapping[str, Any], key: str, default: float) -> float:
    raw = config.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    zero_ok = key == "last_call_timeout"
    if not (value >= 0 if zero_ok else value > 0) or value > 7 * 86400:
        raise SettingsError(
            f"--rdzv-conf {key}={raw}: a number of seconds "
            f"{'from 0' if zero_ok else 'over 0'} up to a week"
        )
    return value


def _local_world_size(config: Mapping[str, Any], argv: Sequence[str] | None) -> int:
    """The node's workers: ``local_world_size`` in ``--rdzv-conf``, else torchrun's own
    ``--nproc-per-node`` when it is a number; 0 when neither says (the log then says so)."""
    raw = config.get("local_world_size")
    if raw is not None:
        if not str(raw).isdecimal() or not 1 <= int(raw) <= 65536:
            raise SettingsError(f"--rdzv-conf local_world_size={raw}: a whole number >= 1")
        return int(raw)
    args = list(argv if argv is not None else sys.argv)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            if not value and i + 1 < len(args):
                value = args[i + 1]
            return int(value) if value.isdecimal() and 1 <= int(value) <= 65536 else 0
    return 0
