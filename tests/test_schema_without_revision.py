"""A store with taskward's tables but no schema revision (its `alembic_version` gone):
every command that checks the schema refuses it as `migrate` does, `schema_unknown`
with the same next step (docs/cli.md, `taskward migrate`), on both stores.

The check used to call it `schema_behind` and send the operator to `taskward migrate`,
which then refused it as `schema_unknown`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from infra.cli import main
from tests.databases import migrated_store

REFUSAL = ("Error: schema_unknown: the database has tables of taskward's names (")
NEXT_STEP = ("but no schema revision: not a taskward store, or one without its revision; "
             "refusing to touch it — point TASKWARD_DATABASE_URL at an empty database or "
             "a taskward store")


def _said(command: list[str]) -> str:
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    return line


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_store_without_its_revision_is_refused_by_every_command_as_migrate_refuses_it(
        kind: str, tmp_path: Path, sqlite_template: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with migrated_store(kind, tmp_path, sqlite_template) as url:
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE alembic_version"))
        engine.dispose()
        monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
        monkeypatch.setenv("TASKWARD_DATABASE_URL", url)
        monkeypatch.setenv("TASKWARD_MODELS_DIR", str(tmp_path))
        refused = _said(["migrate"])
        assert refused.startswith(REFUSAL) and refused.endswith(NEXT_STEP), refused
        for command in (["tasks", "list"], ["recover"], ["clients", "list"]):
            assert _said(command) == refused, command
