"""``python -m coordinator``: serve, replay, compact, explain, token, demo.

- ``serve --db log.db [--host 127.0.0.1] [--port 8470]`` runs the coordinator: it opens the log
  (a path, a ``sqlite:///`` or a ``postgresql://`` URL), restores the latest snapshot, replays
  the tail, starts the rendezvous store and serves HTTP until SIGINT/SIGTERM; with
  ``--retain POLICY`` it runs ``compact`` as a child process every ``--retain-every`` seconds.
- ``replay log.db [--json] [--until OFFSET] [--group G] [--from-start]`` folds the log (from
  offset 1, or on a compacted log from the oldest kept snapshot it needs, verified; it says
  which on stderr), prints the view history and checks it against the stored projections.
  Exit status: 0 when they agree, 1 on any divergence, 2 when the log cannot be read or
  folded as asked. ``--plot timeline.png`` (or ``.svg``) also draws the view history.
- ``compact log.db [--retain POLICY] [--step N] [--json]`` removes heartbeat-class records
  behind a kept snapshot (docs/operations.md, "Retention"). Exit status: 0 done (also when
  nothing was removable), 1 when the verifying fold diverges (nothing removed), 2 when the log
  cannot be read.
- ``explain log.db --group G --rank R [--until OFFSET] [--json]`` tells the rank's story: the
  records that brought it to its state and its place in or out of ``active_ranks``
  (:mod:`coordinator.host.story`, the same story as ``GET /groups/{group}/ranks/{rank}/story``).
  A facet may tell a story of its own instead, by the option its plugin declares (its
  ``explain``, ``coordinator/fold/registry.py``): ``explain log.db --refit NAME`` a refit's
  (its epochs, joins and transfers), ``explain log.db --rdzv JOB`` a torchrun job's
  rendezvous (every join, round, leave and the closing).
- ``group list|show|end|delete [NAME] [--coordinator URL]`` asks a running coordinator: every
  group with where its run stands, one group's document, or ends a group's run (its ranks are
  told to stop; its history stays) or deletes it (ended, and gone from the listings and the
  server's limits). Exit status 0 done, 1 refused (the coordinator's answer), 2 unreachable.
- ``token --group G --rank R`` prints the agent token for that rank (reads ``FOLDPLANE_SECRET``
  or ``--secret``).
- ``demo`` shows the whole loop on a local SQLite file with real gloo workers.

Every command but ``token`` and ``group`` needs the server's packages (``pip install 'foldplane[server]'``);
without them it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .coordinator.runtime import loop_factory, tune_for_latency

DEFAULT_PORT = 8470
#: Logs at least this long get a progress bar on stderr even when it is not a terminal.
LONG_LOG = 200_000
#: The modules ``foldplane[server]`` adds to the worker's install (pyproject.toml).
SERVER_MODULES = frozenset(
    {
        "fastapi",
        "starlette",
        "uvicorn",
        "httptools",
        "uvloop",
        "sqlalchemy",
        "asyncpg",
        "alembic",
        "prometheus_client",
        "grpc",
    }
)
INSTALL_SERVER = "pip install 'foldplane[server]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. ``demo`` owns its options (``--db``, ``--port``, ``--help``): they are
    passed to its own parser untouched, since a subparser's ``REMAINDER`` does not capture an
    argument that starts with ``-``; every other command rejects what it does not know."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    missing = getattr(args, "server_missing", None)
    if missing is not None and args.command not in (None, "token", "group"):
        return _without_server(args.command, missing)
    if args.command == "demo":
        args.rest = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command not in ("token", "group") and (error := _install_facets()):
            print(f"{args.command}: {error}", file=sys.stderr)
            return 2
        return args.run(args)
    except ImportError as exc:
        if not _is_server_module(exc):
            raise
        return _without_server(args.command, exc)


def _install_facets() -> str | None:
    """Plug in the facets ``FOLDPLANE_FACETS`` names (``coordinator/fold/registry.py``) before
    any log is opened or folded; what is wrong with a name, or None."""
    from .coordinator.fold import registry

    try:
        registry.install(os.environ.get(registry.FACETS_ENV))
    except ValueError as exc:
        return f"{registry.FACETS_ENV}: {exc}"
    return None


def _is_server_module(exc: ImportError) -> bool:
    return (exc.name or "").split(".")[0] in SERVER_MODULES


def _without_server(command: str, exc: ImportError) -> int:
    print(
        f"{command}: the coordinator's packages are not installed ({exc}); "
        f"install them with: {INSTALL_SERVER}",
        file=sys.stderr,
    )
    return 2


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and one-line help, the builder of its options, and what runs it.

    A builder adds the command's options to its parser and returns the ImportError of a server
    package its options needed that this install lacks (only ``serve``'s do), else None."""

    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], ImportError | None]
    run: Callable[[argparse.Namespace], int]
    #: False for ``demo``, whose options, ``--help`` included, are its own parser's (see main)
    add_help: bool = True


def _parser() -> argparse.ArgumentParser:
    """The command line: one subparser per entry of ``COMMANDS``, in its order."""
    from .agent.invocation import invoked_as

    p = argparse.ArgumentParser(
        prog=invoked_as("foldplane.coordinator", "foldplane-coordinator"),
        description="foldplane's coordinator: serve, replay, compact, explain, group, token, demo.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        s = sub.add_parser(command.name, help=command.help, add_help=command.add_help)
        if (missing := command.options(s)) is not None:
            p.set_defaults(server_missing=missing)
        s.set_defaults(run=command.run)
    return p


def _serve_options(p: argparse.ArgumentParser) -> ImportError | None:
    """``serve``'s options; the ImportError when the server's packages, which its limits
    need, are not installed."""
    p.add_argument(
        "--db",
        required=True,
        help="the log: a SQLite path, sqlite:/// or postgresql:// URL; a new SQLite log is "
        "created only where no file is, and any file that is not a foldplane log is refused",
    )
    p.add_argument(
        "--init-empty",
        action="store_true",
        help="make the new log in --db's file although it exists, when it is empty (no byte, "
        "or a SQLite database without a table)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--store-port",
        type=int,
        default=0,
        help="port of the rendezvous TCPStore (0: any free port; -1: do not host a store)",
    )
    p.add_argument("--store-host", default=None, help="address to advertise for the store")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback bind without auth")
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=20_000,
        help="snapshot the fold every N records (or every --snapshot-beats heartbeats)",
    )
    p.add_argument(
        "--snapshot-beats",
        type=int,
        default=2_000_000,
        help="snapshot the fold every N heartbeats written (or every --snapshot-every records)",
    )
    p.add_argument(
        "--heartbeat-flush-s",
        type=float,
        default=0.5,
        help="how long heartbeats wait to share one record, in seconds (default 0.5)",
    )
    p.add_argument(
        "--shutdown-lead-s",
        type=float,
        default=2.0,
        help="how long a shutdown_with_save waits for its checkpoint rank to be handed it "
        "before the group's other ranks get it, at most, in seconds (default 2)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--retain",
        default=None,
        metavar="POLICY",
        help="remove heartbeat-class records behind a kept snapshot now and then, keeping the "
        "last N records (1000000) or a duration of them (1h, 30m, 7d); default: keep all",
    )
    p.add_argument(
        "--retain-every",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how often --retain runs a compaction (default 300)",
    )
    missing = None
    try:
        _limit_options(p.add_argument_group("limits (docs/operations.md, Limits)"))
    except ImportError as exc:  # a worker's install: only ``token`` can run (see main)
        if not _is_server_module(exc):
            raise
        missing = exc
    _ha_options(p)
    try:
        facets = _facets_of_options()
    except ImportError as exc:  # a worker's install: serve cannot run (see main)
        return missing or exc
    from .coordinator.fold import registry

    for plugin in facets.plugins:
        if (served := registry.part(plugin, "serve")) is not None:
            served.options(p)
    return missing


def _facets_of_options() -> Any:
    """The facets whose options the parser lists (``serve``'s and ``explain``'s): those of
    ``FOLDPLANE_FACETS``, or the built-in ones when it names a wrong package (``main`` says
    so before the command runs). Raises ImportError when the server's packages are not
    installed."""
    from .coordinator.fold import registry

    try:
        return registry.Facets(os.environ.get(registry.FACETS_ENV))
    except ValueError:
        return registry.default()


def _ha_options(p: argparse.ArgumentParser) -> None:
    """``serve``'s options for several coordinators on one log."""
    ha = p.add_argument_group("several coordinators on one PostgreSQL log (docs/ha.md)")
    ha.add_argument(
        "--advertise",
        default=None,
        metavar="URL",
        help="the URL other coordinators send clients to (default http://HOST:PORT)",
    )
    ha.add_argument(
        "--lease-s",
        type=float,
        default=1.0,
        help="leader lease in seconds: a frozen leader is replaced after about this long "
        "(default 1.0)",
    )
    ha.add_argument(
        "--lease-poll-s",
        type=float,
        default=0.1,
        help="how often a standby looks at the lease, in seconds (default 0.1)",
    )


def _replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("db", help="the log: a SQLite path, sqlite:/// or postgresql:// URL")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--until", type=int, default=None, metavar="OFFSET", help="stop at this offset")
    p.add_argument("--group", default=None, help="only this group")
    p.add_argument("--progress", choices=["auto", "always", "never"], default="auto")
    p.add_argument(
        "--from-start",
        action="store_true",
        help="fold from offset 1 even if kept snapshots exist (refused on a compacted log)",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help=(
            "also draw the view history to FILE, and each rank's part of the epochs when the log "
            "has epoch plans (.png or .svg; needs matplotlib: the [plot] extra)"
        ),
    )


def _compact_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("db", help="the log: a SQLite path, sqlite:/// or postgresql:// URL")
    p.add_argument(
        "--retain",
        default="0",
        metavar="POLICY",
        help="what to keep of the heartbeat class: the last N records (1000000) or a duration "
        "(90s, 30m, 1h, 7d); default 0: remove everything removable behind the projections",
    )
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="records removed per step, each one transaction behind its own kept snapshot",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    p.add_argument("--progress", choices=["auto", "always", "never"], default="auto")


def _explain_options(p: argparse.ArgumentParser) -> ImportError | None:
    """``explain``'s options: a rank's ``--group G --rank R``, and the option of each facet
    that tells a story of its own (its plugin's ``explain``, ``coordinator/fold/registry.py``),
    in the facets' order; the ImportError when the server's packages are not installed."""
    p.add_argument("db", help="the log: a SQLite path, sqlite:/// or postgresql:// URL")
    p.add_argument("--group", default=None)
    p.add_argument("--rank", type=int, default=None)
    stories: list[tuple[str, Any]] = []
    missing = None
    try:
        facets = _facets_of_options()
    except ImportError as exc:  # a worker's install: explain cannot run (see main)
        missing = exc
    if missing is None:
        for plugin in facets.plugins:
            if (told := plugin.explain) is not None:
                action = p.add_argument(
                    told.option, default=None, metavar=told.metavar, help=told.help
                )
                stories.append((action.dest, told))
    p.set_defaults(facet_stories=tuple(stories))
    p.add_argument("--until", type=int, default=None, metavar="OFFSET", help="stop at this offset")
    p.add_argument("--json", action="store_true", help="print the story as JSON")
    return missing


def _group_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "show", "end", "delete"])
    p.add_argument("name", nargs="?", default=None, help="the group (not for list)")
    p.add_argument(
        "--coordinator",
        default=os.environ.get("FOLDPLANE_COORDINATOR") or f"http://127.0.0.1:{DEFAULT_PORT}",
        help=f"coordinator URL (default $FOLDPLANE_COORDINATOR, else "
        f"http://127.0.0.1:{DEFAULT_PORT})",
    )
    p.add_argument("--token", default=None, help="the operator token (default $FOLDPLANE_TOKEN)")
    p.add_argument("--reason", default=None, help="why the run ends (end only; kept in the log)")
    p.add_argument("--json", action="store_true", help="print the coordinator's JSON answer")


def _token_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--secret", default=None, help="the server secret (default: $FOLDPLANE_SECRET)")


def _demo_options(p: argparse.ArgumentParser) -> None:
    """None: the demo's options are its own parser's (see main); this one only names it."""


# -- serve ---------------------------------------------------------------------------------------


def _limit_options(group: Any) -> None:
    """One option per limit of ``api.limits.LIMITS``; each defaults to its environment variable,
    else to the built-in default."""
    from .api.limits import LIMITS, Limits

    defaults = Limits()
    for doc in LIMITS:
        default = getattr(defaults, doc.field)
        kind = type(default)
        raw = os.environ.get(doc.env)
        group.add_argument(
            doc.flag,
            dest=doc.field,
            type=kind,
            default=raw if raw else default,  # argparse converts a string default with `type`
            metavar="N" if kind is int else "S",
            help=f"{Limits.describe(doc.field)} (default {default}; ${doc.env}); over it: "
            f"{doc.answer}",
        )


def _check_open_files(max_connections: int) -> None:
    """Warn when the process may run out of file descriptors before the connection cap."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < max_connections + 64:
        logging.getLogger("foldplane").warning(
            "--max-connections %d is above what the open-file limit (ulimit -n %d) leaves for "
            "connections; raise the limit or lower --max-connections",
            max_connections,
            soft,
        )


def _limits(args: argparse.Namespace) -> Any:
    from .api.limits import LIMITS, Limits

    return Limits(**{doc.field: getattr(args, doc.field) for doc in LIMITS})


def _serve(args: argparse.Namespace) -> int:
    from .coordinator.auth import Authenticator, BindRefused, check_bind

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    auth = Authenticator(
        operator_token=os.environ.get("FOLDPLANE_TOKEN") or None,
        secret=os.environ.get("FOLDPLANE_SECRET") or None,
    )
    try:
        check_bind(args.host, auth, insecure=args.insecure)
    except BindRefused as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    from .coordinator.host.leadership import LeaseSettings

    try:
        args.limits = _limits(args)
    except ValueError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    _check_open_files(args.limits.max_connections)
    if not auth.enabled:
        logging.getLogger("foldplane").warning(
            "auth is off (neither FOLDPLANE_TOKEN nor FOLDPLANE_SECRET is set): any process "
            "that reaches %s:%d may create groups, propose and speak for every rank",
            args.host,
            args.port,
        )
    try:
        args.lease = LeaseSettings(lease_s=args.lease_s, poll_s=args.lease_poll_s)
    except ValueError as exc:
        print(f"coordinator: --lease-s/--lease-poll-s: {exc}", file=sys.stderr)
        return 2
    for flag, value in (
        ("--snapshot-every", args.snapshot_every),
        ("--snapshot-beats", args.snapshot_beats),
    ):
        if value < 1:
            print(f"coordinator: {flag} must be at least 1, got {value}", file=sys.stderr)
            return 2
    if not args.heartbeat_flush_s >= 0:
        print(
            f"coordinator: --heartbeat-flush-s must be >= 0 seconds, got {args.heartbeat_flush_s}",
            file=sys.stderr,
        )
        return 2
    if not args.shutdown_lead_s >= 0:
        print(
            f"coordinator: --shutdown-lead-s must be >= 0 seconds, got {args.shutdown_lead_s}",
            file=sys.stderr,
        )
        return 2
    for served in _facet_serves():
        if (problem := served.check(args)) is not None:
            print(f"coordinator: {problem}", file=sys.stderr)
            return 2
    if args.advertise is not None and not args.advertise.startswith(("http://", "https://")):
        print(
            f"coordinator: --advertise {args.advertise!r} must start with http:// or https://",
            file=sys.stderr,
        )
        return 2
    if args.retain is not None:
        from .coordinator.host.retention import parse_policy

        try:
            parse_policy(args.retain)
        except ValueError as exc:
            print(f"coordinator: --retain: {exc}", file=sys.stderr)
            return 2
        if not args.retain_every > 0:
            print(
                "coordinator: --retain-every must be a positive number of seconds", file=sys.stderr
            )
            return 2
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_serve_async(args, auth))


def _facet_serves() -> list[Any]:
    """The ``serve`` parts of the installed facets (their plugins' ``serve``), in the facets'
    order: each checks its options and starts what they ask for beside the HTTP server."""
    from .coordinator.fold import registry

    parts = (registry.part(plugin, "serve") for plugin in registry.plugins())
    return [part for part in parts if part is not None]


async def _serve_async(args: argparse.Namespace, auth: Any) -> int:
    from .api.app import create_app
    from .api.server import Server, config
    from .coordinator.host.replica import open_host
    from .eventlog import LogError

    try:
        host = await open_host(
            args.db,
            address=args.advertise or f"http://{args.host}:{args.port}",
            settings=args.lease,
            snapshot_every=args.snapshot_every,
            snapshot_beats=args.snapshot_beats,
            heartbeat_flush_s=args.heartbeat_flush_s,
            shutdown_lead_s=args.shutdown_lead_s,
            adopt_empty=args.init_empty,
        )
    except (LogError, OSError, ValueError) as exc:
        print(f"coordinator: cannot open the log {args.db!r}: {exc}", file=sys.stderr)
        return 2
    store = None
    retention = None
    served: list[Any] = []  # what the facets started beside the HTTP server, closed in reverse
    if args.retain is not None:
        from .coordinator.host.compaction import retain_periodically

        retention = asyncio.get_running_loop().create_task(
            retain_periodically(
                args.db,
                args.retain,
                args.retain_every,
                is_leader=lambda: host.role.name == "leader",
            )
        )
    try:
        if args.store_port >= 0:
            from .coordinator.host.store_server import start_store

            store, host.store_address = start_store(
                args.host, args.store_port, advertise=args.store_host
            )
        try:
            for part in _facet_serves():
                if (started := await part.start(args, host, auth)) is not None:
                    served.append(started)
        except OSError as exc:
            print(f"coordinator: {exc}", file=sys.stderr)
            return 2
        app = create_app(host, auth, limits=args.limits)
        server = Server(config(app, args.host, args.port, args.log_level, args.limits))
        tune_for_latency()
        server.before_shutdown = host.stop_waiting
        server.on_started = lambda: logging.getLogger("foldplane").info(
            "serving %s on http://%s:%d (term %d, offset %d, store %s, auth %s)",
            args.db,
            args.host,
            args.port,
            host.log.term,
            host.machine.offset,
            host.store_address,
            "on" if auth.enabled else "off",
        )
        await server.serve()
        return 0 if server.started else 2
    finally:
        if retention is not None:
            retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retention
        for started in reversed(served):
            await started.close()
        await host.close()
        del store


# -- replay --------------------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    from .coordinator.host.replay import CompactedLog, replay
    from .eventlog import LogError

    if args.plot is not None:
        from .coordinator.plot import PlotError, check_target

        try:
            check_target(args.plot)
        except PlotError as exc:
            print(f"replay: --plot: {exc}", file=sys.stderr)
            return 2
    bar = _ProgressBar(args.progress)
    timeline = None
    if args.plot is not None:
        from .coordinator.plot import Timeline

        timeline = Timeline(args.group)
    try:
        report = asyncio.run(
            replay(
                args.db,
                until=args.until,
                group=args.group,
                progress=bar.update,
                from_start=args.from_start,
                on_record=None if timeline is None else timeline.fresh,
            )
        )
    except CompactedLog as exc:
        bar.done()
        print(f"replay: cannot fold {args.db!r} as asked: {exc}", file=sys.stderr)
        return 2
    except (LogError, OSError, ValueError) as exc:
        bar.done()
        print(f"replay: cannot read {args.db!r}: {exc}", file=sys.stderr)
        return 2
    bar.done()
    print(report.start.describe(), file=sys.stderr)
    print(f"replay: read {report.folded} records of {args.db}", file=sys.stderr)
    _audit_warnings("replay", args.db, report.head)
    if args.json:
        json.dump(report.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(report.views)
        print(
            f"\nfolded {report.folded} of {report.head} records; projections at offset "
            f"{report.projected}; {len(report.views)} views"
        )
        for problem in report.divergences:
            print(f"DIVERGENCE: {problem}")
        print(
            "OK: replay matches the stored projections"
            if report.ok
            else f"FAILED: {len(report.divergences)} divergence(s)"
        )
    if args.plot is not None:
        from .coordinator.plot import PlotError, plot_views

        try:
            plot_views(report.views, args.plot, timeline)
        except PlotError as exc:
            print(f"replay: --plot: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0 if report.ok else 1


def _compact(args: argparse.Namespace) -> int:
    from .coordinator.host.compaction import STEP_RECORDS, compact
    from .coordinator.host.replay import CompactedLog
    from .coordinator.host.retention import parse_policy
    from .eventlog import LogError

    try:
        policy = parse_policy(args.retain)
    except ValueError as exc:
        print(f"compact: --retain: {exc}", file=sys.stderr)
        return 2
    step = STEP_RECORDS if args.step is None else args.step
    if step < 1:
        print(f"compact: --step must be at least 1, got {step}", file=sys.stderr)
        return 2
    bar = _ProgressBar(args.progress, "compact")
    try:
        report = asyncio.run(
            compact(
                args.db,
                policy,
                step_records=step,
                progress=bar.update,
                on_step=None if args.json else _print_step,
            )
        )
    except CompactedLog as exc:
        bar.done()
        print(f"compact: cannot fold {args.db!r}: {exc}", file=sys.stderr)
        return 2
    except (LogError, OSError, ValueError) as exc:
        bar.done()
        print(f"compact: cannot read {args.db!r}: {exc}", file=sys.stderr)
        return 2
    bar.done()
    print(report.start.describe().replace("replay:", "compact:", 1), file=sys.stderr)
    if args.json:
        json.dump(report.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for problem in report.divergences:
            print(f"DIVERGENCE: {problem}")
        print(report.describe())
    return 0 if report.ok else 1


def _print_step(at: int, removed: Any) -> None:
    print(
        f"step: removed {removed.removed:,} records of offsets {removed.first}-{removed.last}, "
        f"snapshot kept at {at}",
        flush=True,
    )


# -- explain -------------------------------------------------------------------------------------


def _audit_warnings(command: str, db: str, records: int) -> None:
    """What an audit of ``db`` should say beside its answer: an empty log, and a SQLite log
    whose ``-wal`` file is not beside it (a copy taken while a coordinator ran needs it: the
    records not yet checkpointed into the main file are in the WAL)."""
    if records == 0:
        print(f"{command}: warning: {db} holds no records", file=sys.stderr)
    if db.startswith("postgresql"):
        return
    from .eventlog.target import parse_target

    path = parse_target(db).path  # type: ignore[union-attr]
    if records == 0 and not os.path.exists(f"{path}-wal"):
        print(
            f"{command}: warning: no {path}-wal beside it: a log copied while its coordinator "
            "ran needs its -wal file too (or copy it after the coordinator stopped)",
            file=sys.stderr,
        )


def _explain(args: argparse.Namespace) -> int:
    from .coordinator.host.story import StoryError, format_story, story_from
    from .eventlog import LogError

    stories = args.facet_stories
    whose = [(told, key) for dest, told in stories if (key := getattr(args, dest)) is not None]
    options = [f"{told.option} {told.metavar}" for _, told in stories]
    rank = "--group G --rank R"
    rank_story = f"{rank} (a rank's story)"
    if len(whose) > 1 or (whose and (args.group is not None or args.rank is not None)):
        print(
            f"explain: give one of {_either(rank, *options)}, not both",
            file=sys.stderr,
        )
        return 2
    if not whose and (args.group is None or args.rank is None):
        print(
            f"explain: give {_either(rank_story, *options)}",
            file=sys.stderr,
        )
        return 2
    told = whose[0][0] if whose else None
    try:
        if told is not None:
            story = asyncio.run(told.function("tell")(args.db, whose[0][1], until=args.until))
        else:
            story = asyncio.run(story_from(args.db, args.group, args.rank, until=args.until))
    except StoryError as exc:
        print(f"explain: {exc.detail}", file=sys.stderr)
        return 2
    except (LogError, OSError, ValueError) as exc:
        print(f"explain: cannot read {args.db!r}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(story, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        shown = told.function("shown") if told is not None else None
        print(format_story(shown(story) if shown is not None else story))
    return 0


def _either(*options: str) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"


class _ProgressBar:
    """A one-line progress bar on stderr, shown on a terminal or for a long log."""

    def __init__(self, mode: str, what: str = "replay") -> None:
        self.mode = mode
        self.what = what
        self.shown = False

    def update(self, position: int, total: int) -> None:
        show = self.mode == "always" or (
            self.mode == "auto" and (sys.stderr.isatty() or total >= LONG_LOG)
        )
        if not show or total <= 0:
            return
        self.shown = True
        width = 30
        filled = int(width * position / total)
        sys.stderr.write(
            f"\r{self.what} [{'#' * filled}{'.' * (width - filled)}] {100 * position / total:5.1f}% "
            f"{position:,}/{total:,} records"
        )
        sys.stderr.flush()

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _print_table(views: list[dict[str, Any]]) -> None:
    header = [
        "group",
        "version",
        "active_ranks",
        "healthy_set",
        "cause",
        "acked",
        "dropped",
        "offset",
        "time (UTC)",
    ]
    rows = []
    for v in views:
        cause = v["cause"]
        why = cause.get("kind", "?")
        if cause.get("proposals"):
            why += " " + ",".join(str(p) for p in cause["proposals"])
        rows.append(
            [
                v["group"],
                str(v["version"]),
                _ranks(v["active_ranks"]),
                _ranks(v["healthy_set"]),
                why,
                _ranks(v["acked_ranks"]),
                _ranks(v["dropped_ranks"]),
                str(v["offset"]),
                dt.datetime.fromtimestamp(v["ts"] / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[
                    :-3
                ],
            ]
        )
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def _ranks(ranks: list[int]) -> str:
    return "[" + ",".join(str(r) for r in ranks) + "]"


# -- token, demo ---------------------------------------------------------------------------------


def _group(args: argparse.Namespace) -> int:
    from .agent.client import (
        CoordinatorClient,
        CoordinatorError,
        CoordinatorUnavailable,
        group_run,
    )
    from .wire.life import run_text

    if (args.name is None) != (args.action == "list"):
        print(
            f"group {args.action}: "
            + ("give the group's name" if args.name is None else "list takes no name"),
            file=sys.stderr,
        )
        return 2
    token = args.token or os.environ.get("FOLDPLANE_TOKEN")
    try:
        client = CoordinatorClient(args.coordinator, token=token)
    except ValueError as exc:
        print(f"group: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            body: Any = {"groups": client.groups()}
        elif args.action == "show":
            body = client.group(args.name)
        elif args.action == "end":
            payload = {} if args.reason is None else {"reason": args.reason}
            body = client.request("POST", f"/groups/{args.name}/end", json=payload)
        else:
            body = client.request("DELETE", f"/groups/{args.name}")
    except CoordinatorUnavailable as exc:
        print(
            f"group {args.action}: no foldplane coordinator at {args.coordinator}: {exc}",
            file=sys.stderr,
        )
        return 2
    except CoordinatorError as exc:
        print(f"group {args.action}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.json:
        print(json.dumps(body, indent=2))
    elif args.action == "list":
        lines = body["groups"]
        if not lines:
            print(f"no groups at {args.coordinator}")
        for line in lines:
            print(f"{line['group']}: {run_text(line)}")
    else:
        print(group_run(body)[1])
    return 0


def _token(args: argparse.Namespace) -> int:
    from .wire.auth import agent_token

    secret = args.secret or os.environ.get("FOLDPLANE_SECRET")
    if not secret:
        print("token: set FOLDPLANE_SECRET or pass --secret", file=sys.stderr)
        return 2
    try:
        print(agent_token(secret, args.group, args.rank))
    except ValueError as exc:
        print(f"token: {exc}", file=sys.stderr)
        return 2
    return 0


def _demo(args: argparse.Namespace) -> int:
    try:
        from .demo import main as demo_main
    except ImportError as exc:
        if _is_server_module(exc):
            raise  # main names the extra to install
        print(f"demo: not available ({exc})", file=sys.stderr)
        return 2
    return int(demo_main(args.rest) or 0)


#: The subcommands, in the order ``--help`` lists them.
COMMANDS = (
    Command("serve", "run the coordinator service", _serve_options, _serve),
    Command(
        "replay",
        "fold a log from scratch and check the stored projections",
        _replay_options,
        _replay,
    ),
    Command(
        "compact",
        "remove heartbeat-class records behind a kept snapshot",
        _compact_options,
        _compact,
    ),
    Command(
        "explain",
        "why a rank (or a refit, or a torchrun job's rendezvous) is where it is: its story "
        "from the log",
        _explain_options,
        _explain,
    ),
    Command(
        "group",
        "list, show, end or delete groups on a running coordinator",
        _group_options,
        _group,
    ),
    Command("token", "print the agent token for one (group, rank)", _token_options, _token),
    Command("demo", "show the whole loop with real workers", _demo_options, _demo, add_help=False),
)
