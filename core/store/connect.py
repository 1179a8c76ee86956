"""Engines for both stores, configured for taskward's access pattern, and the `Database`
over them: the store's one way in, so every dialect setting lives beside the code
that relies on it (`BEGIN IMMEDIATE` needs the driver's autocommit, WAL the pragmas)."""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from core.clock import Clock
from core.settings import Settings, SettingsError
from core.store.database import Database
from core.store.libpq import (
    IDLE_IN_TRANSACTION,
    LOCK_WAIT,
    bound_session,
    closed_while_idle,
    named_for,
    unknown_options,
    with_bounds,
)

# Which taskward process a connection serves, as a DBA sees it in `pg_stat_activity`
# (`application_name` taskward-<role>): an API worker, a sweeper (`sweeper`, `sweep`),
# the all-in-one `run`, or any other command.
ProcessRole = Literal["api", "sweeper", "run", "cli"]
# The roles whose connections write a worker's flushes, heartbeats and completions.
_SWEEPING: frozenset[ProcessRole] = frozenset({"sweeper", "run"})


def create_db_engine(settings: Settings, role: ProcessRole = "api", *,
                     create: bool = True) -> Engine:
    """An engine for `settings.database_url`; SQLite gets WAL, busy timeout, synchronous,
    PostgreSQL the connection bounds (`core.store.libpq`), a sweeper's bound on lock
    waits (`sweeper_lock_wait_ms`) and `role`'s name. The API
    app opens its store without naming a role, so "api" is the default. A SQLite store
    that does not exist is made only when `create` (for what migrates it)."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        if url.database:
            _owner_only(Path(url.database), create=create)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False,
                          "timeout": settings.sqlite_busy_timeout_ms / 1000},
            pool_size=8,
            max_overflow=16,
        )
        _configure_sqlite(engine, settings)
        return engine
    unknown = unknown_options(url)
    if unknown:
        raise SettingsError(
            f"TASKWARD_DATABASE_URL: unknown connection option {', '.join(unknown)} "
            "(libpq's: https://www.postgresql.org/docs/current/libpq-connect.html"
            "#LIBPQ-PARAMKEYWORDS); correct or remove it")
    # No HSTORE column exists: without `use_native_hstore` the dialect's first connection
    # looks the type up (one more round trip before a process's first statement).
    engine = create_engine(named_for(with_bounds(url, settings.store_wait_seconds), role),
                           pool_size=8, max_overflow=16, pool_pre_ping=False,
                           use_native_hstore=False)
    bounds_ms = {IDLE_IN_TRANSACTION: math.ceil(settings.store_wait_seconds * 1000)}
    if role in _SWEEPING:
        bounds_ms[LOCK_WAIT] = sweeper_lock_wait_ms(settings)
    bound_session(engine, bounds_ms)
    event.listen(engine, "checkout", _not_closed_while_idle)
    return engine


def sweeper_lock_wait_ms(settings: Settings) -> int:
    """How long a sweeper's statement waits for a lock another transaction holds
    (`lock_timeout`) before it fails with `55P03`: a quarter of the heartbeat interval.

    A sweeper's own holds last milliseconds; a longer one is someone else's (an
    operator's `SELECT ... FOR UPDATE`, a long migration), and waiting it out stalled
    the whole process: the one stream thread's shared flush waited on the held row
    holding every other task's row it had bumped, the lease keeper's renewals queued
    behind those, and every attempt ended lost. With the bound the flush gives up, is
    written task by task and only the held task's output waits
    (`core.store.worker_writes.append_outputs`, `scheduler.stream_thread`); a renewal
    of the held task fails and is tried at the next tick, the others' renew at most
    this late, far inside the lease. API processes wait as before: a request is
    bounded by `TASKWARD_STORE_WAIT_SECONDS`, and `taskward run`'s requests, on the
    sweeper's connections, answer `503 store_unavailable` past this bound."""
    return max(1, math.ceil(settings.heartbeat_seconds * 1000 / 4))


def _not_closed_while_idle(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection the server ended while it sat idle (`closed_while_idle`) is
    replaced at checkout: SQLAlchemy connects that pool slot afresh when a checkout
    listener raises `DisconnectionError`. Without it, after a PostgreSQL restart the
    first request of each process that drew such a connection was answered `503`."""
    if closed_while_idle(dbapi_connection):
        raise DisconnectionError("the server ended this connection while it was idle")


def _owner_only(database: Path, *, create: bool) -> None:
    """Create the store's directory (0700) and file (0600) for their owner alone, or
    `SettingsError` (one line: what is wrong, what to do) with nothing changed.
    Without `create`, a store that is not there is such an error: a command that could
    only find a new store behind head made one (and its directories) on its way to
    saying so.

    Prompts and outputs live in these files. SQLite gives `-wal` and `-shm` the mode
    of the database file, so they follow. An existing store is narrowed too (one made
    by an older version was 0644): its group and other permissions are cleared and none
    is added, so a store the operator made read-only (a restored backup kept 0444)
    stays read-only, 0400. An existing directory is the operator's and is left as it
    is, unless this call created it. Only a store is narrowed: whatever
    else the URL names (`/dev/null`, a model file, a directory) is refused untouched,
    where a chmod before SQLite's own check had made it 0600, as root too. Without
    `create`, an empty file is left as it is too: it holds nothing yet, the schema
    check refuses it unopened (`never_written`), and `migrate` narrows it before
    writing.
    """
    try:
        made = create and _created_with_directory(database)
        if not made:
            _refuse_unless_a_store(database)
        if not create and _never_written(database):
            return
    except OSError as exc:
        raise SettingsError(_cannot_use(database, exc, create=create)) from None
    for path in (database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))):
        try:
            mode = path.stat().st_mode
            if stat.S_ISREG(mode) and mode & 0o077:
                path.chmod(stat.S_IMODE(mode) & 0o700)
        except FileNotFoundError:
            continue
        except PermissionError:  # another user's file: theirs to narrow
            continue


def _created_with_directory(database: Path) -> bool:
    """`_created`, in a directory made (0700) if it is missing."""
    directory = database.parent
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
    return _created(database)


def _created(database: Path) -> bool:
    """Whether this call made `database` (empty and 0600); False when it was there.
    A symbolic link to no file is followed, as SQLite follows it: the store is made
    where it points (`O_EXCL` alone refuses any link as there already)."""
    try:
        os.close(os.open(os.path.realpath(database),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _refuse_unless_a_store(database: Path) -> None:
    """`SettingsError` unless `database` is a regular file that is empty or begins as
    every SQLite database does. Nothing else is opened: a device may act on `open`."""
    mode = database.stat().st_mode
    kind = next((name for test, name in _NOT_FILES if test(mode)), None)
    if kind is None:
        with open(database, "rb") as file:
            head = file.read(len(_SQLITE_HEADER))
        if not head or head == _SQLITE_HEADER:
            return
        kind = "a file that is not a SQLite database"
    raise SettingsError(f"TASKWARD_DATABASE_URL names {database.absolute()}, {kind}, not a "
                        "taskward store; nothing was changed")


_SQLITE_HEADER = b"SQLite format 3\x00"
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
              (stat.S_ISSOCK, "a socket"))


def _cannot_use(database: Path, exc: OSError, *, create: bool) -> str:
    """The line for an `OSError` met making the store's directory or file, or reading
    the file that is there: what failed, and what the operator can do about it."""
    if (behind_link := _dangling_link(database)) is not None:
        return behind_link
    if not create and exc.errno == errno.ENOENT:
        return _not_there(database)
    there = os.path.lexists(database)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        todo = ("make it and its directory writable by this user" if there
                else "make its directory writable by this user") + " or set TASKWARD_DATABASE_URL"
    else:  # a name too long, a file where a directory should be, …
        todo = "set TASKWARD_DATABASE_URL to a path this user can use"
    return (f"cannot {'open' if there else 'create'} the store {database.absolute()}: "
            f"{exc.strerror}; {todo}")


def _dangling_link(database: Path) -> str | None:
    """The line for a store behind a symbolic link whose target is missing where
    nothing is made: the link is the store itself and its target's directory is
    missing, or the link is one of the store's directories. None otherwise. Such a
    link was told as "No such file or directory", which named neither the link nor
    its target; taskward makes no directory there, where a volume may not be mounted."""
    for path in (database, *database.parents):  # os.path's tests: an error is False
        if os.path.islink(path) and not os.path.exists(path):
            target = Path(os.path.realpath(path))
            missing = target.parent if path == database else target
            if os.path.isdir(missing):
                return None  # only the store's file is missing: `migrate` makes it there
            what = "the store" if path == database else "the store's directory"
            return (f"{what} {path.absolute()} is a symbolic link to {target}, "
                    f"which does not exist: create the directory {missing} (or mount its "
                    "volume) or point the link at an existing directory, then run "
                    "`taskward migrate`; nothing was created")
    return None


def _never_written(database: Path) -> bool:
    """Whether `database` is an empty file with no write-ahead log beside it: a store
    nothing has migrated yet. Opening it would change it (WAL is set on every
    connection, which writes the file's header)."""
    return (database.stat().st_size == 0
            and not database.with_name(database.name + "-wal").exists())


def never_written(engine: Engine) -> bool:
    """Whether `engine` is SQLite's over a store file that is there and empty. The
    schema check reads such a store as one at no revision without connecting: a
    command refused for it (behind head) had made it a 4 KiB WAL database, 0600."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database:
        return False
    try:
        return _never_written(Path(database))
    except OSError:  # not there: the connection names what is wrong
        return False


def _not_there(database: Path) -> str:
    return (f"there is no store at {database.absolute()}: run `taskward migrate` first, "
            "which creates it, or set TASKWARD_DATABASE_URL to an existing store; nothing "
            "was created")


def open_database(settings: Settings, clock: Clock | None = None,
                  role: ProcessRole = "api", *, create: bool = True) -> Database:
    return Database(create_db_engine(settings, role, create=create), clock)


def _configure_sqlite(engine: Engine, settings: Settings) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={settings.sqlite_busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
