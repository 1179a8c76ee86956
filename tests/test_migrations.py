"""Migrations reach head on both stores; an unknown or stale schema is refused."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, event, text

from core.errors import SchemaMismatch
from core.settings import Settings
from core.store.connect import create_db_engine
from core.tables import metadata
from infra.migrate import check_schema, head_revision, upgrade


def test_a_migrated_database_is_at_head(database_url: str) -> None:
    engine = create_db_engine(Settings(database_url=database_url))
    check_schema(engine)
    assert upgrade(engine) == head_revision()  # a second upgrade is a no-op
    engine.dispose()


def test_the_schema_check_reads_the_revision_once(database_url: str) -> None:
    """Every process checks before its first statement (a sweeper before its first
    claim): one lookup of the version table and one read of it, no more."""
    engine = create_db_engine(Settings(database_url=database_url))
    engine.connect().close()  # the dialect's own first-connection queries are not ours
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _conn, _cursor, statement, *_: statements.append(statement))
    check_schema(engine)
    engine.dispose()
    assert len(statements) == 2, statements
    assert "version_num" in statements[1]


def test_a_database_at_an_unknown_revision_is_refused_untouched(database_url: str) -> None:
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
    with pytest.raises(SchemaMismatch, match="unknown"):
        check_schema(engine)
    with pytest.raises(SchemaMismatch, match="unknown"):
        upgrade(engine)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == (
            "from_the_future")
        conn.execute(text(f"UPDATE alembic_version SET version_num = '{head_revision()}'"))
    engine.dispose()


def test_an_empty_database_is_refused_until_migrated(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/empty.db"
    engine = create_db_engine(Settings(database_url=url))
    with pytest.raises(SchemaMismatch, match="taskward migrate"):
        check_schema(engine)
    upgrade(engine)
    check_schema(engine)
    engine.dispose()


def test_the_migrated_schema_is_the_one_core_tables_declares(database_url: str) -> None:
    """Alembic's autogenerate sees no difference between head and `core/tables.py`: a
    column, type, nullability, index or unique constraint on one side only would mean
    a schema change that no migration carries (or the reverse)."""
    engine = create_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, metadata)
    engine.dispose()
    assert differences == []


def test_each_partial_index_gives_both_stores_its_where() -> None:
    """`core.tables` hands a partial index's `where` to the dialects only when they are
    asked for it (a process then imports its own store's dialect only): the DDL of
    either store still carries it, and alembic still sees it."""
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex

    partial = [index for table in metadata.tables.values() for index in table.indexes
               if index.dialect_options["sqlite"]["where"] is not None]
    assert "ix_tasks_due" in {index.name for index in partial}
    for index in partial:
        where = str(index.dialect_kwargs["sqlite_where"])
        assert str(index.dialect_kwargs["postgresql_where"]) == where
        for dialect in (sqlite.dialect(), postgresql.dialect()):
            assert str(CreateIndex(index).compile(dialect=dialect)).endswith(f"WHERE {where}")


def test_the_revision_chain_read_from_the_files_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    from infra.migrate import alembic_config, known_revisions

    script = ScriptDirectory.from_config(alembic_config())
    assert known_revisions() == {s.revision: s.down_revision for s in script.walk_revisions()}
    assert head_revision() == script.get_current_head()
