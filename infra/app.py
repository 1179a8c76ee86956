"""The API as a process serves it: its store opened and its schema checked here.

`handlers.app.create_app` knows routes, not where the database is or how migrations
are checked; this module hands it both. `taskward serve` runs `serving_app` under
granian (a factory, one app per worker); `taskward run` adds its sweeper through
`on_startup`/`on_started`/`on_shutdown`. A stop signal ends the worker's streams and
long-polls; one that came while the worker was starting is let in only once its app's
handlers are in place (`infra.stop_signals.let_stop_signals_in`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence

from litestar import Litestar

from core.engines.registry import import_engine_modules
from core.settings import Settings, load_settings
from core.store.connect import ProcessRole, open_database
from handlers.app import LifespanHook, create_app
from infra.migrate import check_schema
from infra.parent_watch import watch_parent
from infra.stop_signals import also_on, let_stop_signals_in, on_loop

SERVING_APP = "infra.app:serving_app"


def serving_app(
    settings: Settings | None = None,
    *,
    on_startup: Sequence[LifespanHook] = (),
    on_started: Sequence[Callable[[Litestar], None]] = (),
    on_shutdown: Sequence[LifespanHook] = (),
    role: ProcessRole = "api",
) -> Litestar:
    """The API for `settings` (default: read from the environment and taskward.toml),
    over a database of its own that the app disposes of at shutdown, its connections
    named for `role` (`taskward run`'s worker serves its sweeper too).

    `on_startup` hooks run while a served worker's stop signals are still held (what a
    signal does is set there); `on_started` ones run after they are let in, and only if
    none came while the worker was starting: what they start would only be stopped."""
    settings = settings or load_settings()
    watch_parent()
    import_engine_modules(settings.engine_module_names)  # registration checks engine names
    db = open_database(settings, role=role)
    # Probes call the readiness check every few seconds; alembic would log two lines each.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    return create_app(settings, db, readiness=lambda: check_schema(db.engine),
                      on_startup=[_end_waits_when_told_to_stop, *on_startup,
                                  _unless_stopped_meanwhile(on_started)],
                      on_shutdown=on_shutdown)


def _unless_stopped_meanwhile(hooks: Sequence[Callable[[Litestar], None]]) -> LifespanHook:
    """The last startup hook: let the stop signals in, then run `hooks` unless one came."""
    def let_in(app: Litestar) -> None:
        if let_stop_signals_in():
            return
        for hook in hooks:
            hook(app)
    return let_in


def _end_waits_when_told_to_stop(app: Litestar) -> None:
    """From the first SIGTERM or SIGINT on, every SSE stream and long-poll of this
    worker ends at once (`LiveTail.close_waits`): granian's worker stops only once
    every open connection has ended, and one client following a queued task held a
    stop for ever. A stream whose client has stopped reading is waiting on its send,
    not on the tail: it ends when that send times out (`handlers.slow_readers`)."""
    tail = app.state.services.tail
    also_on((signal.SIGTERM, signal.SIGINT),
            on_loop(tail.close_waits))
