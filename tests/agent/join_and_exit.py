"""A light worker for the launcher tests: join over the wire protocol, then exit with a code.

``python join_and_exit.py CODE [wait]``: joins as ``FOLDPLANE_RANK`` with
``FOLDPLANE_INCARNATION``, prints the coordinator's answer as one JSON line, waits for a line
on stdin if asked (the line printed carries torchrun's variables as ``torchrun``, and its
restart count and store as ``elastic``), then leaves cleanly (``exit`` event) for code 0 or just
exits with CODE (saying so on stderr).
CODE ``abort`` leaves cleanly, then aborts (SIGABRT, as a gloo teardown can); ``abort-early``
aborts without leaving. No torch: the launcher's behaviour does not depend on the data plane.
"""

from __future__ import annotations

import json
import os
import sys

import httpx


def main() -> int:
    how = sys.argv[1]
    code = 0 if how == "abort" else -1 if how == "abort-early" else int(how)
    url = os.environ["FOLDPLANE_COORDINATOR"].split(",")[0]
    token = os.environ.get("FOLDPLANE_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    me = {
        "group": os.environ["FOLDPLANE_GROUP"],
        "rank": int(os.environ["FOLDPLANE_RANK"]),
        "incarnation": os.environ["FOLDPLANE_INCARNATION"],
    }
    answer = httpx.post(
        f"{url}/agents/events", json={"events": [{"type": "join", **me}]}, headers=headers
    )
    torchrun = {
        k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    elastic = {
        k: os.environ.get(k)
        for k in (
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
    }
    print(
        json.dumps(
            {
                "status": answer.status_code,
                **answer.json(),
                "torchrun": torchrun,
                "elastic": elastic,
            }
        ),
        flush=True,
    )
    if code not in (0, -1):
        print(
            f"rank {me['rank']}: failing with code {code} on purpose", file=sys.stderr, flush=True
        )
    if sys.argv[2:] == ["wait"]:
        sys.stdin.readline()
    if code == 0:
        httpx.post(
            f"{url}/agents/events", json={"events": [{"type": "exit", **me}]}, headers=headers
        )
    if how.startswith("abort"):
        os.abort()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
