"""Schema migrations (Alembic) and the start-up schema check.

`upgrade` brings a database to head in one write transaction, so that processes
starting together, and writers still running beside it, do not race it. `check_schema`
refuses a database whose revision this code does not know — a newer taskward wrote it —
that has taskward's tables but no revision, or that is behind head, with a message that
tells the operator what to do (the same as `upgrade`'s where it refuses too).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from core.errors import SchemaMismatch
from core.store.connect import never_written
from core.store.database import Database
from core.store.outage import is_store_outage
from core.tables import metadata

if TYPE_CHECKING:
    from alembic.config import Config

_MIGRATIONS = Path(__file__).with_name("migrations")
_ADVISORY_LOCK_KEY = 0x7461736B77617264 & 0x7FFFFFFFFFFFFFFF  # "taskward"
_REVISION = re.compile(r"^revision\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision\s*=\s*(?:['\"]([^'\"]+)['\"]|None)", re.MULTILINE)
_SQLITE_ERROR = 1  # SQLite's primary result code for a fault of the statement itself


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@cache
def known_revisions() -> dict[str, str | None]:
    """Each revision of `infra/migrations/versions` and the one it follows.

    Read from the files' `revision` / `down_revision` lines, without importing alembic:
    every process checks the schema at start-up, and alembic's import and script
    loading were a large part of a sweeper's start (`tests/test_migrations.py` checks
    this against alembic's own reading)."""
    chain = {}
    for path in sorted((_MIGRATIONS / "versions").glob("*.py")):
        source = path.read_text()
        revision, down = _REVISION.search(source), _DOWN_REVISION.search(source)
        if revision is not None and down is not None:
            chain[revision.group(1)] = down.group(1)
    return chain


def head_revision() -> str:
    chain = known_revisions()
    [head] = set(chain) - set(chain.values())
    return head


def current_revision(connection: Connection) -> str | None:
    if not inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine) -> str:
    """Migrate to head (a no-op at head); refuses a revision it does not know, and
    tables of taskward's names without a revision.

    All of it is one write transaction (`Database.write`). On SQLite that begins with
    `BEGIN IMMEDIATE`: it waits up to the busy timeout for the write lock, then holds
    it to the end. Begun as a read (the revision), the first DDL had to upgrade a read
    snapshot to a writer, which SQLite refuses at once ("database is locked") when any
    other writer committed in between: while anything else wrote, and for all but one
    of several migrates of a new file. On PostgreSQL a transaction-level advisory lock
    makes processes starting together take turns; it ends with the transaction, however
    that ends, where an unlock after a failed migration met the aborted transaction
    and its error hid the migration's. Before it, the transaction drops any
    `lock_timeout` and `statement_timeout` a DBA set on the role or database (`SET
    LOCAL`, this transaction only): a default meant for requests would end the turn-
    taking wait of every migrate but the first (init containers migrating together)
    and could cut short a long migration the operator chose to run.

    A migration that fails leaves the schema where it was (the transaction rolls back)
    and raises `SchemaMismatch`, `schema_behind` (the schema stays behind head), naming
    the driver's error; a store outage (unreachable, locked, read-only) is raised as it
    is, for the caller to tell as such."""
    start: str | None = None
    try:
        with Database(engine).write() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SET LOCAL lock_timeout = 0"))
                connection.execute(text("SET LOCAL statement_timeout = 0"))
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                                   {"k": _ADVISORY_LOCK_KEY})
            start = current_revision(connection)
            _refuse_unknown(start)
            if start is None:
                _refuse_foreign_tables(connection)
            from alembic import command

            command.upgrade(alembic_config(connection), "head")
    except DBAPIError as exc:
        if not _failed_migration(exc):
            raise
        raise _migration_failed(exc, start) from exc
    return head_revision()


# What to do when PostgreSQL refuses a migration for the database's privileges or
# configuration, by SQLSTATE: the operator's to mend, where any other failure is a
# fault of this version's migrations (or of the store it met).
_NEXT_STEP_BY_SQLSTATE = {
    "42501": (  # insufficient_privilege: PostgreSQL 15's default for a non-owner on public
        "grant this role CREATE on the schema (GRANT CREATE ON SCHEMA public TO <role>) "
        "or point TASKWARD_DATABASE_URL at a database the role owns, then run `taskward "
        "migrate` again"),
    "3F000": (  # invalid_schema_name: a search_path that names no schema there is
        "set the role's or database's search_path (or the URL's `options`) to a schema "
        "that exists and the role may create in, then run `taskward migrate` again"),
}
_REPORT_IT = ("run the version that wrote it (or restore the backup taken before the "
              "upgrade) and report this line")


def _failed_migration(exc: DBAPIError) -> bool:
    """Whether `exc` is a migration's own failure rather than a store outage. SQLite
    raises a statement's fault (a table or index that is there already, a column that
    is missing) as `OperationalError`, as it does a locked or read-only file: its
    primary result code tells them apart. A privilege PostgreSQL refuses is the
    migration's too, though a request meeting it is told as an outage."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return (not is_store_outage(exc) or _sqlstate(exc) in _NEXT_STEP_BY_SQLSTATE
            or (code is not None and code & 0xFF == _SQLITE_ERROR))


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def _migration_failed(exc: DBAPIError, start: str | None) -> SchemaMismatch:
    cause = exc.orig or exc
    said = next(iter(str(cause).strip().splitlines()), "")
    at = start or "nothing"
    todo = _NEXT_STEP_BY_SQLSTATE.get(_sqlstate(exc) or "", _REPORT_IT)
    return SchemaMismatch(
        "schema_behind",
        f"migrating the schema from {at} to {head_revision()} failed "
        f"({type(cause).__name__}: {said}); nothing was changed, the schema is still at "
        f"{at}: {todo}",
    )


def _refuse_foreign_tables(connection: Connection) -> None:
    """A database without a revision that has tables of taskward's names is not one to
    migrate: another application's, or a store that lost its revision. Its first
    CREATE TABLE would fail, and the failure would read like one a retry could mend."""
    found = sorted(set(inspect(connection).get_table_names()) & set(metadata.tables))
    if found:
        raise SchemaMismatch(
            "schema_unknown",
            f"the database has tables of taskward's names ({', '.join(found[:3])}"
            f"{', …' if len(found) > 3 else ''}) but no schema revision: not a taskward "
            "store, or one without its revision; refusing to touch it — point "
            "TASKWARD_DATABASE_URL at an empty database or a taskward store",
        )


def check_schema(engine: Engine) -> None:
    """Raise `SchemaMismatch` unless the database is exactly at this code's head.

    The revision is read once (a table lookup and a SELECT): every process checks
    before its first statement, a sweeper before its first claim. Only a database
    without a revision has its tables listed: one with taskward's tables is refused as
    `upgrade` refuses it, where `schema_behind` sent the operator to a `migrate` that
    would refuse it too. An empty SQLite file is at no revision and is not opened:
    opening it writes it (`core.store.connect.never_written`), and a command refused
    changes nothing."""
    revision: str | None = None
    if not never_written(engine):
        with engine.connect() as connection:
            revision = current_revision(connection)
            if revision is None:
                _refuse_foreign_tables(connection)
    _refuse_unknown(revision)
    if revision != head_revision():
        raise SchemaMismatch(
            "schema_behind",
            f"database schema is at {revision or 'nothing'}, this taskward needs "
            f"{head_revision()}: run `taskward migrate` first",
        )


def _refuse_unknown(revision: str | None) -> None:
    if revision is not None and revision not in known_revisions():
        raise SchemaMismatch(
            "schema_unknown",
            f"database schema revision {revision} is unknown to this taskward "
            "(written by a newer version?); refusing to touch it — upgrade taskward "
            "or point TASKWARD_DATABASE_URL at another database",
        )
