"""PostgreSQL's push: one LISTEN connection per process, for `Database.listener`.

SQLite has no such thing; `Database.listener` says so by returning None, and callers
poll (or hear their own process's announcements through `Database.listen`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import psycopg
from sqlalchemy.exc import DBAPIError

from core.failure_streak import FailureStreak
from core.store.outage import drop_said, is_connection_dropped
from core.thread_names import named_thread

log = logging.getLogger(__name__)

_RECONNECT_SECONDS = 1.0  # while the store is down, one failure each (`FailureStreak`)
_LISTEN_TICK_SECONDS = 0.5  # how often the listener looks at its stop flag
# A LISTEN connection is idle by nature: a server's `idle_session_timeout` (PostgreSQL
# 14 and later) would end it at every quiet spell, to be made again a second later, so
# this one session turns it off for itself. The pool's connections keep the server's
# setting: one ended while idle is replaced when next drawn (`libpq.closed_while_idle`).
_IDLE_SESSION_TIMEOUT_SINCE = 140000


class PgListener:
    """A thread holding one LISTEN connection for `handlers` (channel -> function of
    the payload); it reconnects after any error. After each (re)connection every
    handler is called once with an empty payload: something may have been announced
    while nobody listened. A connection the store drops while listening is one line,
    and made again at once; an outage is logged when it starts, about once a minute
    while it lasts, and when LISTEN is back."""

    def __init__(self, conninfo: str, handlers: Mapping[str, Callable[[str], None]]) -> None:
        self._conninfo = conninfo
        self._handlers = dict(handlers)
        self._stop = threading.Event()
        self._thread = named_thread(self._run, "pg-listener")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        failures = FailureStreak(
            log, f"LISTEN failed (%s, %d in a row); retrying every {_RECONNECT_SECONDS:.0f}s,"
            " new work is found by polling meanwhile", "LISTEN is back after %d failed attempts")
        while not self._stop.is_set():
            listening = False
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    if conn.info.server_version >= _IDLE_SESSION_TIMEOUT_SINCE:
                        conn.execute("SET idle_session_timeout = 0")
                    for channel in self._handlers:
                        conn.execute(f"LISTEN {channel}")
                    failures.succeeded()
                    listening = True
                    for handle in self._handlers.values():
                        handle("")
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=_LISTEN_TICK_SECONDS):
                            self._handlers[notice.channel](notice.payload)
            except psycopg.Error as exc:
                # Judged as the pool's errors are, which SQLAlchemy has translated.
                error = DBAPIError.instance(None, None, exc, psycopg.Error)
                if listening and is_connection_dropped(error):
                    log.warning("%s", drop_said("LISTEN", "listening again", error))
                    continue
                failures.failed(exc)
                self._stop.wait(_RECONNECT_SECONDS)
