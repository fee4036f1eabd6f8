"""A producer for the crash test: appends forever and prints each acknowledged record.

``python crash_child.py DB CHILD`` appends batches from several concurrent tasks and, after each
``append`` returns (the batch is durable), writes one line per record to stdout:
``OFFSET CHILD TASK N`` — exactly what the payload holds, so the parent can check it.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from foldplane.eventlog import NewRecord, open_log


async def main(path: str, child: int) -> None:
    log = await open_log(path)
    out = sys.stdout.buffer

    async def produce(task: int) -> None:
        rng = random.Random(child * 1000 + task)
        n = 0
        while True:
            batch = []
            for _ in range(rng.randint(1, 4)):
                n += 1
                batch.append(
                    NewRecord(
                        kind="heartbeat",
                        group="crash",
                        rank=task,
                        payload={
                            "child": child,
                            "task": task,
                            "n": n,
                            "pad": "x" * rng.randint(0, 300),
                        },
                    )
                )
            offsets = await log.append(batch)
            lines = "".join(
                f"{o} {child} {task} {r.payload['n']}\n"
                for o, r in zip(offsets, batch, strict=True)
            )
            os.write(out.fileno(), lines.encode())  # one write: the parent never sees half a batch

    await asyncio.gather(*(produce(t) for t in range(8)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
