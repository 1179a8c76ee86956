"""Real test databases: a fresh SQLite file per test, a private PostgreSQL database per
session (truncated between tests). Nothing here touches data the suite did not create.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from core.settings import Settings
from core.store.connect import create_db_engine, open_database
from core.tables import metadata
from infra.migrate import upgrade

PG_ADMIN_URL = os.environ.get("TASKWARD_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pg_admin_conninfo() -> str:
    """A working admin connection string (user postgres, else root)."""
    candidates = [PG_ADMIN_URL, PG_ADMIN_URL.replace("postgres@", "root@", 1)]
    last: Exception | None = None
    for conninfo in candidates:
        try:
            with psycopg.connect(conninfo, connect_timeout=3):
                return conninfo
        except psycopg.OperationalError as exc:
            last = exc
    raise RuntimeError(
        f"PostgreSQL is not reachable at {PG_ADMIN_URL}: start it with "
        "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` "
        f"({last})"
    )


@contextmanager
def private_pg_database() -> Iterator[str]:
    """Create a uniquely named database, yield its SQLAlchemy URL, drop it afterwards."""
    admin = pg_admin_conninfo()
    name = f"taskward_test_{secrets.token_hex(6)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate_to_head(url: str) -> str:
    """This version's `upgrade` of the database at `url`, as `taskward migrate` runs it
    (through a `Database`, so SQLite's writes begin as taskward begins them)."""
    db = open_database(Settings(database_url=url))
    try:
        return upgrade(db.engine)
    finally:
        db.dispose()


# Up to this many rows a table is emptied by DELETE, beyond it by TRUNCATE.
_DELETED_UP_TO = 1000


def truncate_all(url: str) -> None:
    """Empty every table of the store at `url`, between the tests sharing its database.

    A TRUNCATE gives each table and index new files, synced at commit: ~80 ms for all
    of them on every PostgreSQL test, most of whose tables hold nothing or a few rows.
    So only tables that hold rows are emptied, each by DELETE while small (its few dead
    rows are autovacuum's) and by TRUNCATE when big (a test that filled 100,000)."""
    names = [t.name for t in reversed(metadata.sorted_tables)]  # children first
    sizes = " UNION ALL ".join(
        f"SELECT '{name}', count(*) FROM (SELECT 1 FROM \"{name}\" LIMIT {_DELETED_UP_TO}) AS r"
        for name in names)
    with psycopg.connect(url.replace("+psycopg", "", 1)) as conn:
        held: dict[str, int] = dict(conn.execute(sizes).fetchall())
        big = [name for name in names if held[name] >= _DELETED_UP_TO]
        if big:
            conn.execute("TRUNCATE " + ", ".join(f'"{name}"' for name in big) + " CASCADE")
        for name in names:
            if 0 < held[name] < _DELETED_UP_TO:
                conn.execute(f'DELETE FROM "{name}"')


def copy_sqlite(template: Path, target: Path) -> str:
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@contextmanager
def migrated_store(kind: str, workdir: Path, sqlite_template: Path) -> Iterator[str]:
    """The URL of a migrated, empty store of `kind` (`sqlite`: a file in `workdir`;
    `postgresql`: a private database, dropped afterwards), for tests that start processes."""
    if kind == "sqlite":
        yield copy_sqlite(sqlite_template, workdir / "taskward.db")
        return
    with private_pg_database() as url:
        engine = create_db_engine(Settings(database_url=url))
        upgrade(engine)
        engine.dispose()
        yield url
