"""Request bodies on their way in: company the group commit knows is coming.

`handlers.enqueuing.Enqueuer` commits the requests that wait together as one batch.
Under load the requests of a process arrive in waves (the producers an answered batch
released send again together), and the first of a wave to reach the enqueuer used to
commit alone while the others were still being read, a hop through granian's threads
away: with 8 producers over 2 workers, batches of ~2. A births statement costs the
database ~0.15 CPU-ms whatever it carries, and the event loop ~0.13 more. So before
taking a batch the enqueuer waits for the bodies that were being read when it looked,
at most `MAX_WAIT_SECONDS`; never for a request that has not arrived, so a lone
request waits for nothing, and nothing is answered before its commit either way.

`handlers.slow_clients.bounded_body_reads` tells it of each body: `started` when a
request that declares one arrives, `finished` once it has been read or the request
has ended without reading it.
"""

from __future__ import annotations

import asyncio

MAX_WAIT_SECONDS = 0.002  # a body that has arrived is a hop away: tens of microseconds


class Arrivals:
    def __init__(self) -> None:
        self._reading: set[object] = set()
        self._waiters: list[tuple[set[object], asyncio.Future[None]]] = []

    def started(self, request: object) -> None:
        self._reading.add(request)

    def finished(self, request: object) -> None:
        self._reading.discard(request)
        for awaited, settled in self._waiters:
            awaited.discard(request)
            if not awaited and not settled.done():
                settled.set_result(None)

    async def read(self) -> None:
        """Return once every body being read now has been, or after the bound."""
        if not self._reading:
            return
        waiter = (set(self._reading), asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            # `timeout`, not `wait_for`: on Python 3.11 `wait_for` wraps the wait in a
            # task of its own, on every batch taken under load.
            async with asyncio.timeout(MAX_WAIT_SECONDS):
                await waiter[1]
        except TimeoutError:
            pass
        finally:
            self._waiters.remove(waiter)
