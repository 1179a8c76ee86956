"""Transactions over either store, and the few places where the dialects differ.

A write transaction on SQLite starts with `BEGIN IMMEDIATE`, so the write lock is
taken up front and two writers never deadlock on a lock upgrade; on PostgreSQL a plain
`BEGIN` plus `FOR UPDATE SKIP LOCKED` in the claim does the same job. Callers never
branch on the dialect: they ask this module's named abilities (`single_writer`,
`data_modifying_ctes`, `listener`, `recovery_scope`, `beside`), or `core.store.bulk` for
many-row writes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.exc import DBAPIError

from core.clock import Clock
from core.store.held import HeldTasks
from core.store.libpq import libpq_conninfo

if TYPE_CHECKING:
    from core.store.listener import PgListener

_WRITE_OPTION = "taskward_write"
_HEARD_AFTER_COMMIT = "taskward_heard_after_commit"  # in `Connection.info`
_LOGGED = "taskward_logged"  # in `Connection.info` of a `write_events`: rows `logged` per task
WORK_CHANNEL = "taskward_work"  # payload: "" (new work is due)
# In-process only; payload: a `Logged` (a task whose event log grew), heard after the commit.
EVENTS_CHANNEL = "taskward_events"


class LoggedEvent(NamedTuple):
    """An event row as the log stores it (the columns `task_events` reads give back)."""

    seq: int
    type: str
    created_at: int
    data: str


class Logged(NamedTuple):
    """A committed write's news of one task's log: its id and, when the writer told
    (`logged`), the rows it added, in order; empty when it did not: read the log."""

    task_id: str
    events: tuple[LoggedEvent, ...]


_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


class Database:
    """An engine, the clock every stored time comes from, and transaction helpers."""

    def __init__(self, engine: Engine, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock = clock or Clock()
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._listeners: dict[str, list[Callable[[Any], None]]] = {}
        self.held_here = HeldTasks()  # tasks this process's workers hold (`held`)
        self._writers = _WriterQueue(self.beside("writer-lock"))
        self._readers = engine if self.is_sqlite else engine.execution_options(
            isolation_level="REPEATABLE READ")
        if self.is_sqlite:
            _take_over_sqlite_transactions(engine)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction: committed on success, rolled back on any exception.

        What the transaction announced to this process (`announce_work`,
        `write_events`) is heard once it HAS committed, and not at all when it fails:
        not when SQLAlchemy's `commit` event fires, which is before the commit, so a
        reader woken by it could still see the old rows and go back to sleep."""
        heard: list[tuple[str, Any]] = []
        with (self._writers.turn(),
              self.engine.connect().execution_options(**{_WRITE_OPTION: True}) as conn):
            conn.info[_HEARD_AFTER_COMMIT] = heard
            try:
                with conn.begin():
                    yield conn
            finally:
                # A connection the failure invalidated (its server ended the session)
                # has a new, empty `info`: the store's error goes on, not a KeyError.
                conn.info.pop(_HEARD_AFTER_COMMIT, None)
        self._tell(heard)

    @contextmanager
    def write_events(self) -> Iterator[Connection]:
        """`write` for a transaction that logs events: once it has committed, this
        process's `EVENTS_CHANNEL` listeners hear a `Logged` of each task it named event
        rows of, with those rows (`logged`, which every insert of event rows calls:
        `transitions.insert_events`, `output_flush.append_events`, and the claim for
        the rows its PostgreSQL statement inserts). The live tail of an
        API in the same process (`taskward run`) then wakes its waiters at once instead
        of at its next poll, and a stream that holds everything before the rows sends
        them without reading the log. Nothing is named while nobody listens (a sweeper
        on its own), so the rows cost nothing there; a transaction that logged nothing
        (a fenced write, an exception) announces nothing."""
        with self.write() as conn:
            rows: dict[str, list[LoggedEvent]] | None = {} if self._hears_events() else None
            conn.info[_LOGGED] = rows
            try:
                yield conn
            finally:
                # A connection whose session ended under a statement is invalid until
                # `write` rolls back: asking its `info` then raised SQLAlchemy's
                # PendingRollbackError in place of the driver's error, which says the
                # connection was lost (what a worker redoes its write on). Its `info`
                # is new and empty once `write` has rolled back anyway.
                if not conn.invalidated:
                    conn.info.pop(_LOGGED, None)
            if rows:
                _heard_after_commit(conn).extend(
                    (EVENTS_CHANNEL, Logged(task_id, tuple(logged_rows)))
                    for task_id, logged_rows in rows.items())

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction: one snapshot for all its statements on both stores.

        SQLite's read transaction is one snapshot by nature. PostgreSQL's default, READ
        COMMITTED, takes a new snapshot per statement: a task read before a completion
        committed and its events read after it gave a `response.completed` whose
        response object lacked the last text and usage. Its reads are REPEATABLE READ
        (set on the driver's connection, sent with the BEGIN: no round trip of its own),
        which a transaction that only reads can never fail to serialise."""
        with self._readers.connect() as conn:
            with conn.begin():
                yield conn

    @property
    def single_writer(self) -> bool:
        """True when the store admits one writer at a time (SQLite): callers that queue
        writes of their own gain nothing from running more than one at once."""
        return self.is_sqlite

    @property
    def data_modifying_ctes(self) -> bool:
        """True when one statement may write several tables through data-modifying
        CTEs (PostgreSQL), where every statement is also a round trip to the server:
        creating tasks then takes one statement (`core.store.pg_births`), and so do
        a claim (`core.store.pg_claims`) and a batch of completions
        (`core.store.pg_completion`)."""
        return not self.is_sqlite

    @contextmanager
    def write_turn(self) -> Iterator[None]:
        """This thread's turn to write, without a transaction yet: on SQLite it comes
        after every write of this process and the others queued before it, and a `write`
        inside it takes no second turn. A group commit gathers its batch once its turn
        has come, so the requests that arrived while it waited ride along."""
        with self._writers.turn():
            yield

    def beside(self, suffix: str) -> str | None:
        """`<database file>.<suffix>`, a file for a lock the processes of one machine
        share (`flock`), or None when the store is no file (PostgreSQL, in-memory SQLite),
        and its processes must agree some other way."""
        database = self.engine.url.database
        if not self.is_sqlite or database in (None, "", ":memory:"):
            return None
        return f"{database}.{suffix}"

    def recovery_scope(self, node_id: str, *, all_nodes: bool = False) -> str | None:
        """The node whose leftover tasks a cold start may recover (None: every task).

        One SQLite file is one machine, so its every task was this node's; PostgreSQL
        is shared by many nodes, and a node restarting must leave the others' running
        tasks alone unless the whole service restarts (`--all`)."""
        return None if self.is_sqlite or all_nodes else node_id

    def listener(self, handlers: Mapping[str, Callable[[str], None]]) -> PgListener | None:
        """A (not yet started) listener calling `handlers[channel](payload)` for the
        announcements of every process, or None when the store has no push (SQLite)."""
        if self.is_sqlite:
            return None
        from core.store.listener import PgListener  # psycopg: SQLite processes never load it

        return PgListener(libpq_conninfo(self.engine), handlers)

    def announce_work(self, conn: Connection, *, notified: bool = False) -> None:
        """Tell sweepers that new work is due, as part of the transaction `conn`.

        PostgreSQL: a NOTIFY, delivered on commit to every listening process (`notified`:
        a statement of `conn` already called `pg_notify(WORK_CHANNEL, '')` itself, saving
        a round trip). Either store: this process's `listen`ers, called after commit.
        SQLite processes without the API in them fall back to short polling."""
        if not self.is_sqlite and not notified:
            conn.execute(_NOTIFY, {"channel": WORK_CHANNEL, "payload": ""})
        _heard_after_commit(conn).append((WORK_CHANNEL, ""))

    def announce_committed_work(self) -> None:
        """Tell this process's `listen`ers that new work is due, once it is committed
        by a statement that committed by itself (`core.store.driver.autocommit_cursor`),
        whose own `pg_notify` told the other processes."""
        self._tell([(WORK_CHANNEL, "")])

    def announce_committed_events(
        self, task_ids: Iterable[str], rows: Iterable[dict[str, Any]] = ()
    ) -> None:
        """`write_events`' announcement for a statement that committed by itself
        (`core.store.pg_claims`, `core.store.pg_completion`): this process's
        `EVENTS_CHANNEL` listeners hear a `Logged` of each task of `rows` with its rows
        (in order, gapless, as `logged` takes them), and of each of `task_ids` that has
        none, naming no rows (they read the log). `rows` is not read while nobody
        listens, so a generator of them costs nothing then."""
        if not self._hears_events():
            return
        named: dict[str, list[LoggedEvent]] = {}
        _name(named, rows)
        self._tell([(EVENTS_CHANNEL, Logged(task_id, tuple(named.get(task_id, ()))))
                    for task_id in dict.fromkeys([*named, *task_ids])])

    def _hears_events(self) -> bool:
        """Whether a listener of this process hears `EVENTS_CHANNEL` (`taskward run`'s
        live tail)."""
        return bool(self._listeners.get(EVENTS_CHANNEL))

    def _tell(self, heard: Iterable[tuple[str, Any]]) -> None:
        """Call this process's listeners of each `(channel, payload)` announced."""
        for channel, payload in heard:
            for hear in list(self._listeners.get(channel, ())):
                hear(payload)

    def listen(self, channel: str, hear: Callable[[Any], None]) -> Callable[[], None]:
        """Call `hear(payload)` (cheap, thread-safe) after each announcement on `channel`
        made through this object commits (the payload: see the channel); returns the
        function that stops it."""
        self._listeners.setdefault(channel, []).append(hear)
        return lambda: self._listeners[channel].remove(hear)

    def dispose(self) -> None:
        self.engine.dispose()


def logged(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    """Name event rows that `conn`'s transaction inserted, so that its announcement
    carries them (`Logged`): every insert of event rows calls this, since an
    announcement that names fewer rows than were logged would have its waiters wait for
    the next poll. Only a `write_events` transaction with someone listening keeps them;
    anywhere else `rows` is not read."""
    logs: dict[str, list[LoggedEvent]] | None = conn.info.get(_LOGGED)
    if logs is not None:
        _name(logs, rows)


def _name(logs: dict[str, list[LoggedEvent]], rows: Iterable[dict[str, Any]]) -> None:
    """Add event rows to `logs` as `LoggedEvent`s by task, in the order given."""
    for row in rows:
        logs.setdefault(row["task_id"], []).append(
            LoggedEvent(row["seq"], row["type"], row["created_at"], row["data"]))


def _heard_after_commit(conn: Connection) -> list[tuple[str, Any]]:
    """What `conn`'s transaction will announce to this process once committed; only
    `Database.write` transactions announce."""
    heard: list[tuple[str, Any]] | None = conn.info.get(_HEARD_AFTER_COMMIT)
    if heard is None:
        raise RuntimeError("announcements are made inside Database.write")
    return heard


def _take_over_sqlite_transactions(engine: Engine) -> None:
    """Begin transactions ourselves, not the sqlite3 module, so writes can be IMMEDIATE.

    The driver's errors are the dialect's DBAPI module's (sqlite3's), looked up here
    rather than imported: a PostgreSQL process never loads that module."""
    if getattr(engine, "_taskward_hooked", False):
        return
    engine._taskward_hooked = True  # type: ignore[attr-defined]

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    driver_error = engine.dialect.loaded_dbapi.Error

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_WRITE_OPTION, False):
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # may wait on the lock: SQLAlchemy's
            return
        # A read's BEGIN takes no lock: sent on the driver itself, a read transaction
        # costs ~150 us of CPU instead of ~220 (SQLAlchemy's execution around the one
        # statement). Its error, if any, is raised as SQLAlchemy's, as the rest are.
        try:
            conn.connection.driver_connection.execute("BEGIN")  # type: ignore[union-attr]
        except driver_error as exc:
            raise DBAPIError.instance("BEGIN", (), exc, driver_error) from exc


class _WriterQueue:
    """Makes the SQLite writers of all processes queue fairly for the one write lock.

    A writer that finds SQLite locked sleeps in its busy handler (1, 2, 5, 10 … 100 ms),
    and a busy neighbour process can take the lock again and again before it wakes:
    throughput holds, but the unlucky writer waits hundreds of milliseconds. An exclusive
    `flock` on a file beside the database is a queue the kernel serves the moment the
    holder lets go; a thread lock in front of it queues the threads of one process, which
    `flock` would not tell apart. Re-entrant, so a nested write fails as before (SQLite's
    busy timeout) instead of waiting for itself. PostgreSQL and in-memory SQLite: no-op.
    """

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._threads = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._pid: int | None = None

    @contextmanager
    def turn(self) -> Iterator[None]:
        if self._path is None:
            yield
            return
        with self._threads:
            self._depth += 1
            try:
                if self._depth == 1:
                    fcntl.flock(self._descriptor(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    if self._depth == 1:
                        fcntl.flock(self._descriptor(), fcntl.LOCK_UN)
            finally:
                self._depth -= 1

    def _descriptor(self) -> int:
        # Opened per process: a descriptor inherited through fork shares its lock.
        if self._pid != os.getpid():
            assert self._path is not None
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        assert self._fd is not None
        return self._fd
