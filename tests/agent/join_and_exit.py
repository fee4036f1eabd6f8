"""A light worker for the launcher tests: join over the wire protocol, then exit with a code.

``python join_and_exit.py CODE [wait]``: joins as ``FOLDPLANE_RANK`` with
``FOLDPLANE_INCARNATION``, prints the coordinator's answer as one JSON line, waits for a line
on stdin if asked, then leaves cleanly (``exit`` event) for code 0 or just exits with CODE.
No torch: the launcher's behaviour does not depend on the data plane.
"""

from __future__ import annotations

import json
import os
import sys

import httpx


def main() -> int:
    code = int(sys.argv[1])
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
    print(json.dumps({"status": answer.status_code, **answer.json()}), flush=True)
    if sys.argv[2:] == ["wait"]:
        sys.stdin.readline()
    if code == 0:
        httpx.post(
            f"{url}/agents/events", json={"events": [{"type": "exit", **me}]}, headers=headers
        )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
