"""The torchrun peer of the recovery benchmarks: restart every worker when one dies.

``restart_all(script, mode, out_env, world, trials)`` runs ``python -m torch.distributed.run
--max-restarts=1`` over ``world`` copies of ``script mode`` and times, per trial, from the
moment the victim wrote ``killed`` into the directory named by ``$out_env`` to the last
restarted worker's ``restarted-<rank>`` file (what each script's worker writes). Shared by
``benchmarks.recovery`` and ``benchmarks.ddp``, whose workers differ but whose harness is this.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks._cluster import free_port

ROOT = Path(__file__).resolve().parents[1]


def restart_all(
    script: str,
    mode: str,
    out_env: str,
    world: int,
    trials: int,
    log: Callable[[str], None],
) -> list[float]:
    samples = []
    for k in range(trials):
        with tempfile.TemporaryDirectory(prefix="foldplane-bench-torchrun-") as out:
            env = {
                **os.environ,
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                out_env: out,
                "OMP_NUM_THREADS": "1",
            }
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
                f"--nproc-per-node={world}", "--max-restarts=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", script, mode,
            ]  # fmt: skip
            proc = subprocess.run(
                cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                timeout=600,
            )  # fmt: skip
            files = {p.name: float(p.read_text()) for p in Path(out).iterdir()}
            restarted = [v for name, v in files.items() if name.startswith("restarted-")]
            if proc.returncode != 0 or "killed" not in files or len(restarted) != world:
                tail = proc.stderr.decode(errors="replace")[-2000:]
                raise RuntimeError(f"torchrun trial {k + 1} failed ({proc.returncode}): {tail}")
            samples.append(max(restarted) - files["killed"])
            log(f"torchrun trial {k + 1}/{trials}: {samples[-1]:.3f} s")
    return samples
