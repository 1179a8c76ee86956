"""Migrations reach head on both stores; an unknown or stale schema is refused; an
upgrade takes turns with other writers and migrates; a failed one says why, in a line."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, event, inspect, select, text

from core.errors import SchemaMismatch
from core.settings import Settings
from core.store.connect import create_db_engine
from core.tables import metadata, tasks
from infra.migrate import alembic_config, check_schema, head_revision, upgrade
from tests.api.served import TASKWARD, service_env
from tests.databases import migrate_to_head, private_pg_database


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

    from infra.migrate import known_revisions

    script = ScriptDirectory.from_config(alembic_config())
    assert known_revisions() == {s.revision: s.down_revision for s in script.walk_revisions()}
    assert head_revision() == script.get_current_head()


@pytest.fixture(params=["sqlite", "postgresql"])
def blank_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database of each kind, for a test to take where it needs."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/taskward.db"
        return
    with private_pg_database() as url:
        yield url


def _migrate_to(url: str, revision: str) -> None:
    """Alembic's own upgrade to `revision`, as an older taskward left the store."""
    engine = create_db_engine(Settings(database_url=url))
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), revision)
    engine.dispose()


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    with engine.connect() as connection:
        revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    engine.dispose()
    return revision


def _task(task_id: str, status: str, created_at: int, retry_of: str | None) -> dict[str, object]:
    return {"id": task_id, "client_id": "c1", "model": "m", "status": status,
            "on_restart": "retry", "attempts": 0, "max_attempts": 3,
            "created_at": created_at, "updated_at": created_at + 1, "run_at": created_at,
            "last_seq": 0, "metadata_json": "{}", "request_json": "{}", "retry_of": retry_of}


def test_a_store_where_a_failed_task_was_retried_twice_upgrades_and_the_oldest_keeps_the_link(
        blank_url: str) -> None:
    """Before 0006 a failed task could be retried twice, both retries active: the unique
    index of 0006 could not be built, and the store stayed at 0005 for good."""
    _migrate_to(blank_url, "0005")
    rows = [_task("failed", "failed", 100, None),
            _task("t-late", "queued", 300, "failed"),  # newer: unlinked
            _task("t-b", "running", 200, "failed"),  # oldest (created_at, then id): kept
            _task("t-c", "queued", 200, "failed"),  # same instant, later id: unlinked
            _task("t-done", "completed", 50, "failed"),  # not active: left linked
            _task("other", "queued", 400, "another")]  # the only retry of its task
    engine = create_engine(blank_url)
    with engine.begin() as connection:
        connection.execute(tasks.insert(), rows)
    assert migrate_to_head(blank_url) == head_revision()
    with engine.connect() as connection:
        after = {row.id: row for row in connection.execute(select(tasks))}
    engine.dispose()
    assert {i: after[i].retry_of for i in after} == {
        "failed": None, "t-late": None, "t-b": "failed", "t-c": None, "t-done": "failed",
        "other": "another"}
    # Nothing else changed: no task lost, cancelled or otherwise touched.
    assert {row.id: (row.status, row.updated_at) for row in after.values()} == {
        str(row["id"]): (row["status"], row["updated_at"]) for row in rows}
    assert _revision(blank_url) == head_revision()


def _taskward(url: str, workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TASKWARD, *args], env=service_env(url, workdir), cwd=workdir,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command_line", [["migrate"], ["run", "--port", "0"]])
def test_a_failing_migration_ends_the_command_with_one_line_naming_its_cause(
        blank_url: str, tmp_path: Path, command_line: list[str]) -> None:
    """A store at 0006 that has the index 0007 makes already. It was a traceback of
    thousands of characters; on PostgreSQL its cause hidden behind the error of an
    unlock sent on the aborted transaction (`InFailedSqlTransaction`)."""
    _migrate_to(blank_url, "0006")
    engine = create_engine(blank_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE INDEX ix_tasks_client_outside_line ON tasks (model)"))
    engine.dispose()
    done = _taskward(blank_url, tmp_path, *command_line)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"Error: schema_behind: migrating the schema from 0006 to "
                           f"{head_revision()} failed ("), line
    assert "ix_tasks_client_outside_line" in line and "already exists" in line, line
    assert line.endswith("nothing was changed, the schema is still at 0006: run the version "
                         "that wrote it (or restore the backup taken before the upgrade) "
                         "and report this line"), line
    assert "Traceback" not in done.stderr and "InFailedSqlTransaction" not in line
    assert _revision(blank_url) == "0006"


def test_tables_of_taskwards_names_without_a_revision_are_refused_untouched(
        blank_url: str) -> None:
    """Another application's database (or a store that lost its revision): it was told
    as a store outage, `table tasks already exists`, to be retried in vain."""
    engine = create_engine(blank_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT)"))
    with pytest.raises(SchemaMismatch) as refused:
        migrate_to_head(blank_url)
    assert refused.value.code == "schema_unknown"
    assert refused.value.message == (
        "the database has tables of taskward's names (tasks) but no schema revision: not "
        "a taskward store, or one without its revision; refusing to touch it — point "
        "TASKWARD_DATABASE_URL at an empty database or a taskward store")
    with engine.connect() as connection:
        names = inspect(connection).get_table_names()
    engine.dispose()
    assert names == ["tasks"]


def test_an_upgrade_on_sqlite_waits_its_turn_while_other_processes_write(
        tmp_path: Path) -> None:
    """Begun as a reader, the upgrade's first write was refused at once ("database is
    locked") whenever another writer had committed since its read: every time while an
    older version's API took creates. Now it waits for the lock, and so do they."""
    url = f"sqlite:///{tmp_path}/taskward.db"
    _migrate_to(url, "0005")
    with closing(sqlite3.connect(tmp_path / "taskward.db")) as connection:
        connection.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
    stop = threading.Event()
    commits: list[int] = []
    failures: list[Exception] = []

    def write() -> None:
        """A writer of its own connection, as another process's: a commit every ~2 ms."""
        with closing(sqlite3.connect(tmp_path / "taskward.db", timeout=30,
                                     isolation_level=None)) as connection:
            while not stop.is_set():
                try:
                    connection.execute("BEGIN IMMEDIATE")
                    connection.execute("INSERT INTO kv (k, v) VALUES (?, 'x') ON CONFLICT "
                                       "(k) DO UPDATE SET v = v || 'x'", (str(len(commits)),))
                    connection.execute("COMMIT")
                except sqlite3.Error as exc:
                    failures.append(exc)
                    return
                commits.append(1)
                stop.wait(0.002)

    def committed_more_than(count: int) -> bool:
        deadline = time.monotonic() + 30
        while len(commits) <= count and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(commits) > count

    writers = [threading.Thread(target=write) for _ in range(2)]
    for writer in writers:
        writer.start()
    try:
        assert committed_more_than(5)
        assert migrate_to_head(url) == head_revision()
        assert committed_more_than(len(commits))  # the writers go on after it
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    assert failures == []
    assert _revision(url) == head_revision()


def test_concurrent_migrates_of_a_new_sqlite_file_take_turns(tmp_path: Path) -> None:
    """Three `taskward migrate` at once on a file none has made yet: two of three were
    refused ("database is locked"); now each waits for the one before it."""
    url = f"sqlite:///{tmp_path}/var/taskward.db"
    env = service_env(url, tmp_path)
    started = [subprocess.Popen([TASKWARD, "migrate"], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
    outcomes = [(p.wait(timeout=120), *p.communicate()) for p in started]
    assert [(code, out.strip()) for code, out, _err in outcomes] == [
        (0, head_revision())] * 3, [err[-500:] for _code, _out, err in outcomes]
    assert _revision(url) == head_revision()
