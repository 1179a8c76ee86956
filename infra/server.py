"""Running the API under granian, programmatically.

granian starts `workers` processes; each imports `target` and, with `factory=True`,
calls it to build its own app (its own engine, pool and live tail), so nothing is
shared between workers but the database. Loopback is the default address: exposing
the API is a decision an operator makes with `--host`.
"""

from __future__ import annotations

import logging
import math
import os
import resource

from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops
from granian.http import HTTP1Settings

from core.settings import DEFAULT_HTTP_MAX_CONNECTIONS
from infra.parent_watch import mark_workers
from infra.stop_signals import hold_stop_signals

log = logging.getLogger("taskward.server")

APP_FACTORY = "infra.app:serving_app"
# How long past its drain a worker may take to stop (its streams end at once, its
# sweeper's hand-back is one write) before granian kills it.
STOP_MARGIN_SECONDS = 5
# Descriptors a worker needs besides its connections: the store's connections and files,
# model files, upstream connections, pipes, logs.
OTHER_OPEN_FILES = 1024


def serve(
    target: str = APP_FACTORY,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    factory: bool = True,
    idle_timeout_seconds: float = 30,
    drain_seconds: float = 0,
    max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS,
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

    Each worker starts with its stop signals held, from its fork on, until its app has
    set what they do (`infra.stop_signals`): one that came while it was starting was
    lost, and the worker went on (`taskward run`: sweeping) until it was killed.

    Each worker holds at most `max_connections` connections open (granian's
    backpressure: an idle one, a stream, a long-poll alike); further ones wait in the
    listen queue, as long as `max_connections` too (the kernel's `net.core.somaxconn`
    may shorten it). granian's default, 1024 per process, let a dozen clients' waits
    within their stream limit leave `/healthz` unanswered.
    """
    bounded = idle_timeout_seconds > 0
    stop_within = math.ceil(drain_seconds) + STOP_MARGIN_SECONDS
    # The app of each (`infra.app.serving_app`) stops when this process is gone.
    mark_workers(stop_within)
    os.register_at_fork(after_in_child=hold_stop_signals)
    per_worker = connections_within_open_files(max_connections)
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
        workers_kill_timeout=stop_within,
        backlog=per_worker,
        backpressure=per_worker,
    ).serve()


def connections_within_open_files(wanted: int) -> int:
    """`wanted`, or fewer when a process may not open enough files for that many
    connections; this process's soft open-files limit, which its workers inherit, is
    first raised as far as they need and the hard limit allows.

    A process out of descriptors fails whatever opens one, its store connections and
    files included, not only the next connection. The usual soft limit (1024: a login
    shell, a systemd unit) is below the default cap; the usual hard limit (systemd's
    524288) is not, so the operator rarely has anything to raise. Importing granian
    raises the soft limit to the hard one today (its `sysinfo` dependency does), which
    granian does not promise: the raise here does not depend on it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + OTHER_OPEN_FILES
    if hard != resource.RLIM_INFINITY and hard < needed:
        allowed = max(hard - OTHER_OPEN_FILES, hard // 2)
        log.warning("serving at most %d connections per process, not the %d of "
                    "TASKWARD_HTTP_MAX_CONNECTIONS: the hard limit on open files is %d "
                    "(raise it to %d: `LimitNOFILE=` in a systemd unit, `ulimit -Hn`, a "
                    "container's `nofile` ulimit)", allowed, wanted, hard, needed)
        wanted, needed = allowed, hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return wanted
