"""What wakes the claiming loop before its next poll.

- PostgreSQL: a LISTEN connection on `WORK_CHANNEL`; `enqueue` NOTIFYs on commit, so
  every sweeper on every machine hears about new work within milliseconds.
- Same process as the API (`taskward run`): `Database.add_work_listener`, which fires
  after the enqueueing transaction commits — the only push SQLite has.
- Otherwise the loop polls every `TASKWARD_POLL_INTERVAL_MS`.

Tasks that become due later (`run_at`, retry backoff) announce nothing, so the loop
still polls, just less often when a push source exists.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from sqlalchemy.engine import make_url

from core.store.database import WORK_CHANNEL

log = logging.getLogger(__name__)

_RECONNECT_SECONDS = 1.0
_LISTEN_TICK_SECONDS = 0.5  # how often the listener looks at its stop flag


class PgListener:
    """A thread holding one LISTEN connection; it reconnects after any error."""

    def __init__(self, database_url: str, wake: threading.Event) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._wake = wake
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
                    conn.execute(f"LISTEN {WORK_CHANNEL}")
                    self._wake.set()  # anything announced while we were not listening
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=_LISTEN_TICK_SECONDS):
                            self._wake.set()
            except psycopg.Error as exc:
                log.warning("LISTEN %s failed (%s); retrying", WORK_CHANNEL, type(exc).__name__)
                self._stop.wait(_RECONNECT_SECONDS)
