"""What wakes the sweeper before its next poll: new work.

- PostgreSQL: a LISTEN connection on `WORK_CHANNEL`; `enqueue` NOTIFYs on commit, so
  every sweeper on every machine hears within milliseconds.
- Same process as the API (`taskward run`): `Database.listen`, called after the
  announcing transaction commits — the only push SQLite has.
- Otherwise the loop polls every `TASKWARD_POLL_INTERVAL_MS`.

Cancels need no push: the lease keeper asks the store at each tick
(`scheduler.heartbeat`).

Tasks that become due later (`run_at`, retry backoff) announce nothing, so the loop
still polls, just less often when a push source exists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

_RECONNECT_SECONDS = 1.0
_LISTEN_TICK_SECONDS = 0.5  # how often the listener looks at its stop flag


class PgListener:
    """A thread holding one LISTEN connection for `handlers` (channel -> function of
    the payload); it reconnects after any error. After each (re)connection every
    handler is called once with an empty payload: something may have been announced
    while nobody listened."""

    def __init__(self, database_url: str, handlers: Mapping[str, Callable[[str], None]]) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._handlers = dict(handlers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    for channel in self._handlers:
                        conn.execute(f"LISTEN {channel}")
                    for handle in self._handlers.values():
                        handle("")
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=_LISTEN_TICK_SECONDS):
                            self._handlers[notice.channel](notice.payload)
            except psycopg.Error as exc:
                log.warning("LISTEN failed (%s); retrying", type(exc).__name__)
                self._stop.wait(_RECONNECT_SECONDS)
