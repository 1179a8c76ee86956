"""Engines for both stores, configured for taskward's access pattern, and the `Database`
over them: the store's one way in, so every dialect setting lives beside the code
that relies on it (`BEGIN IMMEDIATE` needs the driver's autocommit, WAL the pragmas)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from core.clock import Clock
from core.settings import Settings
from core.store.database import Database
from core.store.libpq import closed_while_idle, with_bounds


def create_db_engine(settings: Settings) -> Engine:
    """An engine for `settings.database_url`; SQLite gets WAL, busy timeout, synchronous."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            _owner_only(Path(url.database))
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False,
                          "timeout": settings.sqlite_busy_timeout_ms / 1000},
            pool_size=8,
            max_overflow=16,
        )
        _configure_sqlite(engine, settings)
        return engine
    # No HSTORE column exists: without `use_native_hstore` the dialect's first connection
    # looks the type up (one more round trip before a process's first statement).
    engine = create_engine(with_bounds(url, settings.store_wait_seconds),
                           pool_size=8, max_overflow=16, pool_pre_ping=False,
                           use_native_hstore=False)
    event.listen(engine, "checkout", _not_closed_while_idle)
    return engine


def _not_closed_while_idle(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection the server ended while it sat idle (`closed_while_idle`) is
    replaced at checkout: SQLAlchemy connects that pool slot afresh when a checkout
    listener raises `DisconnectionError`. Without it, after a PostgreSQL restart the
    first request of each process that drew such a connection was answered `503`."""
    if closed_while_idle(dbapi_connection):
        raise DisconnectionError("the server ended this connection while it was idle")


def _owner_only(database: Path) -> None:
    """Create the store's directory (0700) and file (0600) for their owner alone.

    Prompts and outputs live in these files. SQLite gives `-wal` and `-shm` the mode
    of the database file, so they follow. Existing files are narrowed too (a store
    made by an older version was 0644); an existing directory is the operator's and is
    left as it is, unless this call created it.
    """
    directory = database.parent
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
    os.close(os.open(database, os.O_CREAT | os.O_RDWR, 0o600))
    for path in (database, *(database.with_name(database.name + s) for s in ("-wal", "-shm"))):
        try:
            path.chmod(0o600)
        except FileNotFoundError:
            continue
        except PermissionError:  # another user's file: theirs to narrow
            continue


def open_database(settings: Settings, clock: Clock | None = None) -> Database:
    return Database(create_db_engine(settings), clock)


def _configure_sqlite(engine: Engine, settings: Settings) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={settings.sqlite_busy_timeout_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
