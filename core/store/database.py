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
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.exc import DBAPIError, StatementError

from core.clock import Clock
from core.store.held import HeldTasks
from core.store.libpq import libpq_conninfo
from core.thread_names import named_thread

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
        self._writers = _WriterQueue(self.beside("writer-lock"), engine)
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
                    commit_begun()  # before the COMMIT, which may land unacknowledged
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


class _Commits(threading.local):
    """This thread's count of writes sent to be committed (`commits_begun`)."""

    begun = 0


_COMMITS = _Commits()


def commits_begun() -> int:
    """How many writes this thread has sent to be committed so far: `Database.write`'s
    COMMITs and the statements that commit by themselves
    (`core.store.driver.autocommit_cursor`), each counted before it is sent. A call
    that failed while the count stayed as it was committed nothing: a session that
    ends before its COMMIT is rolled back by the server, so the call may be made again
    (`core.store.redo_dropped.redone_if_dropped_before_commit`). One that sent a
    COMMIT may have landed with only the acknowledgement lost."""
    return _COMMITS.begun


def commit_begun() -> None:
    """Count a write about to be sent to be committed on this thread (`commits_begun`)."""
    _COMMITS.begun += 1


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

    The wait for a turn is bounded by this process's busy timeout, and past it fails as
    SQLite's own wait does ("database is locked"): the queue sits in front of SQLite's
    lock, so a writer with a short timeout queued behind a neighbour's long waits for
    that lock would otherwise wait as long as the neighbour, not answer unavailable.
    """

    def __init__(self, path: str | None, engine: Engine) -> None:
        self._path = path
        self._engine = engine
        self._threads = threading.RLock()
        self._depth = 0
        self._busy_timeout: float | None = None  # seconds, read from SQLite once
        self._file: _FileLock | None = None
        self._pid: int | None = None

    @contextmanager
    def turn(self) -> Iterator[None]:
        if self._path is None:
            yield
            return
        self._begin_turn()
        try:
            yield
        finally:
            self._end_turn()

    def _begin_turn(self) -> None:
        """Wait for this thread's turn: first the process's other threads (free at once
        for a nested turn), then the other processes; `_locked` past the busy timeout."""
        waited_since: float | None = None
        if not self._threads.acquire(blocking=False):
            waited_since = time.monotonic()
            if not self._threads.acquire(timeout=self._timeout()):
                raise self._locked()
        try:
            if self._depth == 0:
                self._lock_file(waited_since)
        except BaseException:
            self._threads.release()
            raise
        self._depth += 1

    def _lock_file(self, waited_since: float | None) -> None:
        """Take the `flock` within what is left of the busy timeout, counted from when
        this thread began to wait for its turn (None: it has not waited yet)."""
        file = self._file_lock()
        if file.take_at_once():
            return
        waited = 0.0 if waited_since is None else time.monotonic() - waited_since
        if not file.take(self._timeout() - waited):
            raise self._locked()

    def _end_turn(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._file_lock().release()
        self._threads.release()

    def _timeout(self) -> float:
        """This process's busy timeout in seconds, as SQLite itself has it (`PRAGMA
        busy_timeout`), however the engine was made. Read at the first wait: a process
        whose writers never wait never asks."""
        if self._busy_timeout is None:
            with self._engine.connect() as conn:
                milliseconds = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
            self._busy_timeout = milliseconds / 1000
        return self._busy_timeout

    def _locked(self) -> StatementError:
        """The error SQLite's own busy timeout raises, as SQLAlchemy raises it: callers
        already take it for an outage (`core.store.outage`), and log its `SQLITE_BUSY`."""
        dbapi = self._engine.dialect.loaded_dbapi
        busy: Any = dbapi.OperationalError("database is locked")  # a sqlite3 error
        busy.sqlite_errorcode, busy.sqlite_errorname = dbapi.SQLITE_BUSY, "SQLITE_BUSY"
        return DBAPIError.instance("BEGIN IMMEDIATE", (), busy, dbapi.Error)

    def _file_lock(self) -> _FileLock:
        # Opened per process: a descriptor inherited through fork shares its lock, and
        # the parent's waiter thread is not in the child.
        if self._pid != os.getpid():
            assert self._path is not None
            self._file = _FileLock(self._path)
            self._pid = os.getpid()
        assert self._file is not None
        return self._file


class _FileLock:
    """One process's exclusive `flock` on the writers' queue file, which a writer may
    give up waiting for.

    A blocking `flock` cannot be given up, so a contended one is made by a waiter thread
    (one per process, started at the first contention) while the writer waits for it
    with a timeout; the kernel still hands the lock over the moment its holder lets go,
    where polling would add its interval to every contended turn. The lock belongs to
    the descriptor, not to a thread: the waiter takes it, the writer lets go of it. A
    lock the waiter gets after its writer gave up is let go at once, unless the next
    writer has asked for it meanwhile. One writer at a time asks (the queue's thread
    lock)."""

    def __init__(self, path: str) -> None:
        self._descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._changed = threading.Condition()
        self._asked = False  # the waiter is to take the lock, or is blocked taking it
        self._wanted = False  # a writer waits for the waiter's lock
        self._granted = False  # the waiter took the lock for the writer that wants it
        self._waiter: threading.Thread | None = None

    def take_at_once(self) -> bool:
        """Whether the lock was free and is now this process's: one non-blocking `flock`.
        Not while the waiter's `flock` is under way: the descriptor may have the lock by
        now, so a second `flock` would succeed, and the waiter would then let go of the
        lock it took for nobody, under the writer's feet."""
        if self._asked:
            return False
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def take(self, timeout: float) -> bool:
        """Whether the waiter took the lock for this writer within `timeout` seconds."""
        if timeout <= 0:
            return False
        with self._changed:
            if self._waiter is None:
                self._waiter = named_thread(self._serve, "taskward-writer-queue")
                self._waiter.start()
            self._asked = self._wanted = True
            self._changed.notify_all()
            try:
                return self._changed.wait_for(lambda: self._granted, timeout)
            finally:  # also when interrupted: a lock that comes later is nobody's
                self._wanted = self._granted = False

    def release(self) -> None:
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)

    def _serve(self) -> None:
        """The waiter: take the lock when asked, and hand it to the writer waiting for
        it, or let go of it at once when that writer has given up."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked)
            fcntl.flock(self._descriptor, fcntl.LOCK_EX)
            with self._changed:
                self._granted = self._wanted
                if not self._granted:
                    self.release()
                self._asked = False
                self._changed.notify_all()
