"""Transactions over either store, and the few places where the dialects differ.

A write transaction on SQLite starts with `BEGIN IMMEDIATE`, so the write lock is
taken up front and two writers never deadlock on a lock upgrade; on PostgreSQL a plain
`BEGIN` plus `FOR UPDATE SKIP LOCKED` in the claim does the same job. Callers never
branch on the dialect: they ask this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Column, Connection, Engine, Table, event, text
from sqlalchemy.dialects import postgresql, sqlite

from core.clock import Clock

_WRITE_OPTION = "taskward_write"
WORK_CHANNEL = "taskward_work"


class Database:
    """An engine, the clock every stored time comes from, and transaction helpers."""

    def __init__(self, engine: Engine, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock = clock or Clock()
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._work_listeners: list[Callable[[], None]] = []
        self._conflict_inserts: dict[tuple[str, str], Any] = {}
        if self.is_sqlite:
            _take_over_sqlite_transactions(engine)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction: committed on success, rolled back on any exception."""
        with self.engine.connect().execution_options(**{_WRITE_OPTION: True}) as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (a consistent snapshot on both stores)."""
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    def insert_ignoring_conflicts(self, table: Table, key: Column[Any] | None = None) -> Any:
        """`INSERT … ON CONFLICT DO NOTHING RETURNING key`: a unique index decides, never
        a prior read. Execute it with the row's values; `.first()` is None on a conflict
        (an INSERT's rowcount is not reliable across drivers, RETURNING is).
        Built once per (table, key): statement construction is a hot-path cost.
        """
        cache_key = (table.name, key.key if key is not None else "")
        statement = self._conflict_inserts.get(cache_key)
        if statement is None:
            dialect = sqlite if self.is_sqlite else postgresql
            statement = dialect.insert(table).on_conflict_do_nothing()
            if key is not None:
                statement = statement.returning(key)
            self._conflict_inserts[cache_key] = statement
        return statement

    def announce_work(self, conn: Connection) -> None:
        """Tell sweepers that new work is due, as part of the transaction `conn`.

        PostgreSQL: a NOTIFY delivered on commit to every listening process. Either
        store: in-process listeners (a sweeper sharing the API's process) are woken
        after commit. Other SQLite processes fall back to short polling.
        """
        if not self.is_sqlite:
            conn.execute(text("SELECT pg_notify(:channel, '')"), {"channel": WORK_CHANNEL})
        if self._work_listeners:
            listeners = list(self._work_listeners)
            event.listen(conn, "commit", lambda _conn: [wake() for wake in listeners], once=True)

    def add_work_listener(self, wake: Callable[[], None]) -> None:
        """Call `wake()` (it must be cheap and thread-safe) after work is announced."""
        self._work_listeners.append(wake)

    def dispose(self) -> None:
        self.engine.dispose()


def _take_over_sqlite_transactions(engine: Engine) -> None:
    """Let SQLAlchemy, not the sqlite3 module, emit BEGIN, so writes can be IMMEDIATE."""
    if getattr(engine, "_taskward_hooked", False):
        return
    engine._taskward_hooked = True  # type: ignore[attr-defined]

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
