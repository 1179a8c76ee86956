"""Procrastinate 3.10 at its documented settings: a psycopg 3 async connector, an async
no-op task, `run_worker_async(concurrency=N)` with LISTEN/NOTIFY (the default).

`python -m bench.peer_drivers.procrastinate_queue STEP --dsn DSN …` (see `common`).
"""

from __future__ import annotations

import asyncio

from procrastinate import App, JobContext, PsycopgConnector

from bench.peer_drivers.common import Executions, arguments, emit, paced, produce
from bench.peer_drivers.settings import pool_size

FILL_CHUNK = 1000


def make_app(dsn: str, pool_size: int, executions: Executions | None = None) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=pool_size, max_size=pool_size))

    @app.task(name="noop", pass_context=True)
    async def noop(context: JobContext, i: int) -> None:
        if executions is not None:
            executions.record(context.job.id)

    return app


async def main() -> None:
    args = arguments()
    executions = Executions(args.log) if args.step == "worker" else None
    app = make_app(args.dsn, pool_size(args), executions)
    noop = app.tasks["noop"]
    async with app.open_async():
        if args.step == "setup":
            await app.schema_manager.apply_schema_async()
        elif args.step == "fill":
            for start in range(0, args.count, FILL_CHUNK):
                await noop.batch_defer_async(*({"i": i} for i in range(
                    start, min(args.count, start + FILL_CHUNK))))
        elif args.step == "worker":
            await app.run_worker_async(concurrency=args.slots, wait=True)
        elif args.step == "enqueue":
            emit(await produce(lambda i: noop.defer_async(i=i), args.producers, args.seconds))
        else:
            emit(await paced(lambda i: noop.defer_async(i=i), args.rate, args.count))


if __name__ == "__main__":
    asyncio.run(main())
