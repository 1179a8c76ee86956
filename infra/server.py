"""Running the API under granian, programmatically.

granian starts `workers` processes; each imports `target` and, with `factory=True`,
calls it to build its own app (its own engine, pool and live tail), so nothing is
shared between workers but the database. Loopback is the default address: exposing
the API is a decision an operator makes with `--host`.
"""

from __future__ import annotations

import math

from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops
from granian.http import HTTP1Settings

from infra.parent_watch import mark_workers

APP_FACTORY = "infra.app:serving_app"
# How long past its drain a worker may take to stop (its streams end at once, its
# sweeper's hand-back is one write) before granian kills it.
STOP_MARGIN_SECONDS = 5


def serve(
    target: str = APP_FACTORY,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    factory: bool = True,
    idle_timeout_seconds: float = 30,
    drain_seconds: float = 0,
) -> None:
    """Serve the ASGI app `target` ("module:attribute") until SIGINT or SIGTERM.

    The event loop is uvloop where installed (granian's `auto`), asyncio otherwise.
    HTTP/1.1 only: in granian's `auto` mode a connection waits unbounded for its
    first bytes (to tell HTTP/2's preface from HTTP/1), so an idle connection would be
    held for ever; in HTTP/1 mode the header timeout covers it from the start (and
    every keep-alive wait). HTTP/2 without TLS (prior knowledge) is what that costs.
    `idle_timeout_seconds=0` restores granian's defaults (no bound on a silent client).

    A worker still alive `drain_seconds` (its sweeper's drain, in `taskward run`) plus
    `STOP_MARGIN_SECONDS` after the stop began is killed: granian waits for its workers
    without a bound otherwise, and one deadlocked in granian's own signal handler (~1
    Ctrl-C in 6 of `taskward run`, its main thread holding the GIL while it waits for a
    lock that granian's runtime thread takes only with the GIL) held the stop, and the
    SQLite store's sign of a live sweeper, for ever.
    """
    bounded = idle_timeout_seconds > 0
    mark_workers()  # the app of each (`infra.app.serving_app`) stops when this process is gone
    Granian(
        target,
        address=host,
        port=port,
        workers=workers,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1 if bounded else HTTPModes.auto,
        http1_settings=HTTP1Settings(header_read_timeout=int(idle_timeout_seconds * 1000))
        if bounded else None,
        loop=Loops.auto,
        factory=factory,
        log_access=False,
        workers_kill_timeout=math.ceil(drain_seconds) + STOP_MARGIN_SECONDS,
    ).serve()
