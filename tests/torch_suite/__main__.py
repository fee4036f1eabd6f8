"""``python -m tests.torch_suite``: run torch's backend suite on one backend, record it as JSON.

Examples::

    python -m tests.torch_suite --backend foldplane --world 2 --out run.json
    python -m tests.torch_suite --backend gloo --world 4 -k 'all_reduce|broadcast' --out g4.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.torch_suite import harness


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torch_suite", description=__doc__)
    p.add_argument("--backend", choices=harness.BACKENDS, default="foldplane")
    p.add_argument("--world", type=int, default=2, help="processes (ranks) per test")
    p.add_argument("-k", dest="pattern", help="a regular expression the test names must match")
    p.add_argument("--test", action="append", dest="names", help="an exact test name (repeat)")
    p.add_argument("--out", type=Path, help="the JSON record, rewritten after each test")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test (all ranks)")
    p.add_argument("--start", choices=("fork", "spawn"), default="fork")
    p.add_argument(
        "--no-gloo-gates",
        dest="gloo_gates",
        action="store_false",
        help="foldplane: skip the tests the suite keeps for gloo by name (default: run them)",
    )
    p.add_argument("--list", action="store_true", help="print the test names and stop")
    args = p.parse_args(argv)
    if args.list:
        harness._environment(args.backend, args.world, args.timeout)
        print("\n".join(harness.suite_tests(args.backend, args.world)))
        return 0
    record = harness.run(
        args.backend,
        args.world,
        names=args.names,
        pattern=args.pattern,
        out=args.out,
        timeout_s=args.timeout,
        start=args.start,
        gloo_gates=args.gloo_gates,
    )
    c = harness.counts(record)
    print(
        f"{args.backend} x{args.world}: {c['passed']} passed, {c['failed']} failed, "
        f"{c['skipped']} skipped of {record['selected']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
