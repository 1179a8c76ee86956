"""PgQueuer 1.6 at its documented settings: asyncpg, an async no-op entrypoint,
`PgQueuer.run(batch_size=B, max_concurrent_tasks=N)` (its dequeue needs
`max_concurrent_tasks >= 2 * batch_size`), durable tables (the default). B is its best
setting for each workload (`batch_size`).

`python -m bench.peer_drivers.pgqueuer_queue STEP --dsn DSN …` (see `common`).
"""

from __future__ import annotations

import asyncio

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, PgQueuer, Queries

from bench.peer_drivers.common import Executions, arguments, emit, paced, produce
from bench.peer_drivers.settings import batch_size

FILL_CHUNK = 1000
PAYLOAD = b'{"i": 0}'


async def worker(dsn: str, slots: int, workload: str, executions: Executions) -> None:
    queuer = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn)))

    @queuer.entrypoint("noop")
    async def noop(job: Job) -> None:
        executions.record(job.id)

    await queuer.run(batch_size=batch_size(slots, workload), max_concurrent_tasks=slots)


async def main() -> None:
    args = arguments()
    if args.step == "worker":
        await worker(args.dsn, args.slots, args.workload, Executions(args.log))
        return
    # Producers get one pooled connection each.
    async with asyncpg.create_pool(args.dsn, min_size=args.producers,
                                   max_size=args.producers) as pool:
        queries = Queries(AsyncpgPoolDriver(pool))

        async def enqueue_one(_i: int) -> object:
            [job_id] = await queries.enqueue("noop", PAYLOAD)
            return job_id

        if args.step == "setup":
            await queries.install()
        elif args.step == "fill":
            for start in range(0, args.count, FILL_CHUNK):
                size = min(args.count, start + FILL_CHUNK) - start
                await queries.enqueue(["noop"] * size, [PAYLOAD] * size, [0] * size)
        elif args.step == "enqueue":
            emit(await produce(enqueue_one, args.producers, args.seconds))
        else:
            emit(await paced(enqueue_one, args.rate, args.count))


if __name__ == "__main__":
    asyncio.run(main())
