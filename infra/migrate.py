"""Schema migrations (Alembic) and the start-up schema check.

`upgrade` brings a database to head; on PostgreSQL it holds an advisory lock so that
processes starting together do not race. `check_schema` refuses a database whose
revision this code does not know — a newer taskward wrote it — or that is behind head,
with a message that tells the operator what to run.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from core.errors import SchemaMismatch

_MIGRATIONS = Path(__file__).with_name("migrations")
_ADVISORY_LOCK_KEY = 0x7461736B77617264 & 0x7FFFFFFFFFFFFFFF  # "taskward"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine) -> str:
    """Migrate to head (a no-op at head); refuses a revision it does not know."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
            connection.commit()
        try:
            _refuse_unknown(connection)
            command.upgrade(alembic_config(connection), "head")
            connection.commit()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_unlock(:k)"),
                                   {"k": _ADVISORY_LOCK_KEY})
                connection.commit()
    return head_revision()


def check_schema(engine: Engine) -> None:
    """Raise `SchemaMismatch` unless the database is exactly at this code's head."""
    with engine.connect() as connection:
        _refuse_unknown(connection)
        revision = current_revision(connection)
    if revision != head_revision():
        raise SchemaMismatch(
            "schema_behind",
            f"database schema is at {revision or 'nothing'}, this taskward needs "
            f"{head_revision()}: run `taskward migrate` first",
        )


def _refuse_unknown(connection: Connection) -> None:
    revision = current_revision(connection)
    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if revision is not None and revision not in known:
        raise SchemaMismatch(
            "schema_unknown",
            f"database schema revision {revision} is unknown to this taskward "
            "(written by a newer version?); refusing to touch it — upgrade taskward "
            "or point TASKWARD_DATABASE_URL at another database",
        )
