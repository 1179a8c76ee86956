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
from sqlalchemy import create_engine, text

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


def truncate_all(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names}"))
    engine.dispose()


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
