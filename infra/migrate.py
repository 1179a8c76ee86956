"""Schema migrations (Alembic) and the start-up schema check.

`upgrade` brings a database to head; on PostgreSQL it holds an advisory lock so that
processes starting together do not race. `check_schema` refuses a database whose
revision this code does not know — a newer taskward wrote it — or that is behind head,
with a message that tells the operator what to run.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from core.errors import SchemaMismatch

if TYPE_CHECKING:
    from alembic.config import Config

_MIGRATIONS = Path(__file__).with_name("migrations")
_ADVISORY_LOCK_KEY = 0x7461736B77617264 & 0x7FFFFFFFFFFFFFFF  # "taskward"
_REVISION = re.compile(r"^revision\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision\s*=\s*(?:['\"]([^'\"]+)['\"]|None)", re.MULTILINE)


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
    """Migrate to head (a no-op at head); refuses a revision it does not know."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
            connection.commit()
        try:
            _refuse_unknown(current_revision(connection))
            from alembic import command

            command.upgrade(alembic_config(connection), "head")
            connection.commit()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_unlock(:k)"),
                                   {"k": _ADVISORY_LOCK_KEY})
                connection.commit()
    return head_revision()


def check_schema(engine: Engine) -> None:
    """Raise `SchemaMismatch` unless the database is exactly at this code's head.

    The revision is read once (a table lookup and a SELECT): every process checks
    before its first statement, a sweeper before its first claim."""
    with engine.connect() as connection:
        revision = current_revision(connection)
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
