"""What both peer drivers share: the command line, the executions log, the producers.

Each driver is one command per workload step (`setup`, `fill`, `worker`, `enqueue`,
`paced`); a step that measures prints one JSON document on stdout for `bench/peers.py`.
Times are wall-clock epoch seconds, so they compare with the timestamps the queues'
databases and taskward's clock write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

EnqueueOne = Callable[[int], Awaitable[object]]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["setup", "fill", "worker", "enqueue", "paced"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--log", default="")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=100.0)
    # What a worker is started for: a driver runs each workload at its best setting.
    parser.add_argument("--workload", choices=["drain", "latency"], default="drain")
    return parser.parse_args()


class Executions:
    """Each executed job as one line `<id> <start epoch>`, appended at once (no buffer),
    so the orchestrator counts executions exactly: a job run twice shows twice."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def record(self, job_id: object) -> None:
        os.write(self._fd, f"{job_id} {time.time():.6f}\n".encode())


async def produce(enqueue_one: EnqueueOne, producers: int, seconds: float) -> dict[str, Any]:
    """`producers` concurrent loops, one job per call, for `seconds`: how many were
    acknowledged and each call's latency."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def loop() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            await enqueue_one(next(counter))
            latencies.append(time.perf_counter() - began)

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(producers)))
    return {"count": len(latencies), "seconds": time.perf_counter() - start,
            "latencies": latencies}


async def paced(enqueue_one: EnqueueOne, rate: float, count: int) -> dict[str, Any]:
    """`count` jobs at `rate` per second, one call each: `[job id, epoch before the call]`
    pairs. Open loop: a slow call does not delay the schedule of the next ones."""
    sent: list[list[Any]] = []

    async def one(i: int) -> None:
        began = time.time()
        job_id = await enqueue_one(i)
        sent.append([job_id, began])

    start = time.perf_counter()
    calls = []
    for i in range(count):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        calls.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*calls)
    return {"sent": sent}


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)
