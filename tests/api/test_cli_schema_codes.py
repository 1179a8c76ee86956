"""A schema the command cannot work on is told as every domain error is, `<code>:
<message>` (docs/cli.md), by every command that checks it, not by `migrate` alone."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from infra.cli import main
from tests.databases import copy_sqlite


@pytest.mark.parametrize("command", [["tasks", "list"], ["recover"]], ids=" ".join)
@pytest.mark.parametrize(("revision", "said"), [
    (None, "schema_behind: database schema is at nothing, this taskward needs "),
    ("from_the_future", "schema_unknown: database schema revision from_the_future is "
                        "unknown to this taskward"),
], ids=["behind", "unknown"])
def test_a_schema_refusal_is_printed_with_its_code(
        command: list[str], revision: str | None, said: str, tmp_path: Path,
        sqlite_template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "taskward.db"
    store.touch()  # an empty database: a store not migrated yet (none at all is not made)
    if revision is not None:
        copy_sqlite(sqlite_template, store)
        with closing(sqlite3.connect(store)) as connection, connection:
            connection.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", f"sqlite:///{store}")
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(tmp_path))
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"Error: {said}"), line
