"""The toy facet's part of ``serve`` (its plugin's ``serve``): ``--toy-note FILE``, a line
written to FILE when the coordinator starts serving (the log's offset it serves from) and one
when it shuts down, so a test sees the facet's option parsed, checked, started and closed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def options(p: argparse.ArgumentParser) -> None:
    toy = p.add_argument_group("the toy facet (tests/facets/toy)")
    toy.add_argument(
        "--toy-note",
        default=None,
        metavar="FILE",
        help="write a line to FILE when serving starts and one when it stops",
    )


def check(args: argparse.Namespace) -> str | None:
    if args.toy_note is not None and Path(args.toy_note).is_dir():
        return f"--toy-note {args.toy_note!r} is a directory"
    return None


class Noted:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def close(self) -> None:
        with self.path.open("a") as f:
            f.write("closed\n")


async def start(args: argparse.Namespace, host: Any, auth: Any) -> Noted | None:
    if args.toy_note is None:
        return None
    path = Path(args.toy_note)
    with path.open("a") as f:
        f.write(f"started at offset {host.machine.offset}\n")
    return Noted(path)
