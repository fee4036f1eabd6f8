"""A worker process for the end-to-end tests: a real Agent and a real gloo data plane.

It is driven by the test, one JSON command per line on stdin, and answers with one JSON event
per line on stdout, so a test waits on events instead of sleeping. The agent's identity comes
from the ``FOLDPLANE_*`` environment the launcher sets.

Commands: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``send {dst}``, ``recv {src}``
(each with an optional ``timeout_s`` for the operation's deadline), ``wait_view {active,
min_version, timeout}``, ``wait_state {state, timeout}``, ``activate {ranks}``, ``recover {ranks}``,
``deactivate {ranks}``, ``inject_link_failure {peer}``, ``rejoin``, ``close``.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import torch

from foldplane.agent import Agent


def emit(event: str, **fields: Any) -> None:
    # one write per line (the newline with it): workers share a pipe, and with
    # PYTHONUNBUFFERED print() writes the newline apart, so lines could interleave
    print(json.dumps({"event": event, **fields}) + "\n", end="", flush=True)


def first_elements(output: Any) -> Any:
    if output is None:
        return None
    if isinstance(output, list):
        return [o[0].item() for o in output]
    return output[0].item()


def view_matcher(active: list[int] | None, min_version: int) -> Any:
    def matches(view: Any) -> bool:
        return view.version >= min_version and (active is None or list(view.active_ranks) == active)

    return matches


def main() -> int:
    collective_timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    agent = Agent(
        heartbeat_interval_s=0.25,
        collective_timeout_s=collective_timeout_s,
        p2p_timeout_s=collective_timeout_s,
        backend="gloo",
    )
    agent.start()
    emit("started", rank=agent.rank, incarnation=agent.incarnation, world_size=agent.world_size)
    pg = agent.process_group(backend="gloo")
    rank, world = agent.rank, agent.world_size
    assert world is not None

    def op_result(name: str, work: Any, output: Any = None) -> None:
        """Report the op's outcome and the first element of its output (read after it completed)."""
        emit("issued", op=name, version=pg.version)
        ok = work.wait()
        hint = pg.get_failed_ranks_hint(work).tolist()
        emit(
            name,
            ok=ok,
            hint=hint,
            version=pg.version,
            active=list(pg.active_ranks),
            value=first_elements(output),
        )

    for line in sys.stdin:
        cmd = json.loads(line)
        name = cmd["cmd"]
        try:
            if "timeout_s" in cmd:
                pg.set_collective_timeout_us(int(cmd["timeout_s"] * 1e6))
                pg.set_p2p_timeout_us(int(cmd["timeout_s"] * 1e6))
            if name == "all_reduce":
                t = torch.full((4,), float(rank + 1))
                work = pg.all_reduce(t, async_op=True)
                op_result(name, work, t)
            elif name == "all_gather":
                out = [torch.full((2,), -1.0) for _ in range(world)]
                work = pg.all_gather(out, torch.full((2,), float(rank + 1)), async_op=True)
                op_result(name, work, out)
            elif name == "reduce_scatter":
                inputs = [torch.full((2,), float(10 * rank + i)) for i in range(world)]
                out = torch.full((2,), -1.0)
                work = pg.reduce_scatter(out, inputs, async_op=True)
                op_result(name, work, out)
            elif name == "send":
                work = pg.send(torch.full((2,), float(rank + 1)), int(cmd["dst"]), async_op=True)
                op_result(name, work)
            elif name == "recv":
                t = torch.zeros(2)
                work = pg.recv(t, int(cmd["src"]), async_op=True)
                op_result(name, work, t)
            elif name == "wait_view":
                view = agent.wait_for_view(
                    view_matcher(cmd.get("active"), int(cmd.get("min_version", 1))),
                    timeout=float(cmd.get("timeout", 30.0)),
                )
                emit("view", version=view.version, active=list(view.active_ranks))
            elif name == "wait_state":
                agent.wait_for_state(cmd["state"], timeout=float(cmd.get("timeout", 30.0)))
                emit("state", state=agent.state)
            elif name in ("activate", "recover", "deactivate"):
                propose = {
                    "activate": agent.activate_ranks,
                    "recover": agent.recover_ranks,
                    "deactivate": agent.deactivate_ranks,
                }[name]
                proposal = propose(cmd["ranks"], wait_s=float(cmd.get("wait_s", 30.0)))
                view = agent.view
                emit(
                    "proposal",
                    status=proposal.get("status"),
                    version=proposal.get("version"),
                    id=proposal.get("id"),
                    reason=proposal.get("reason"),
                    view_version=view.version if view else None,
                )
            elif name == "inject_link_failure":
                agent.data_plane.inject_link_failure(int(cmd["peer"]))
                emit("injected", peer=cmd["peer"])
            elif name == "rejoin":
                agent.rejoin()
                emit("rejoining")
            elif name == "close":
                agent.close()
                emit("closed", stopped=agent.stopped.reason if agent.stopped else None)
                return 0
            else:
                emit("error", cmd=name, error=f"unknown command {name!r}")
        except Exception as exc:
            emit("error", cmd=name, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc())
    agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
