"""A command that may not create a store, against an empty SQLite file (made by `touch`,
or by a deployment that never ran `migrate`): exit 1 with the schema check's
`schema_behind` line, which sends the operator to `taskward migrate`, and the file left
as it was (docs/settings.md). It was opened first: made a 4 KiB WAL database and
chmodded 0600 by a command that only reads."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from infra.cli import main
from infra.migrate import head_revision

# In-process: `sweeper` is left out, its start freezes the collector (`sweep` opens
# the store as it does).
READERS = [["tasks", "list"], ["models", "list"], ["clients", "list"], ["recover"],
           ["sweep"], ["serve", "--port", "0"]]


@pytest.fixture
def empty_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty, world-readable file named as the store, alone in its directory."""
    store = tmp_path / "data" / "taskward.db"
    store.parent.mkdir()
    store.touch()
    store.chmod(0o644)
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", f"sqlite:///{store}")
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(tmp_path / "models"))
    return store


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_an_empty_store_file_is_refused_as_behind_and_left_as_it_was(
        command: list[str], empty_store: Path) -> None:
    result = CliRunner().invoke(main, command)
    assert (result.exit_code, result.output.splitlines()) == (1, [
        f"Error: schema_behind: database schema is at nothing, this taskward needs "
        f"{head_revision()}: run `taskward migrate` first"])
    assert empty_store.stat().st_size == 0
    assert stat.S_IMODE(empty_store.stat().st_mode) == 0o644
    assert list(empty_store.parent.iterdir()) == [empty_store]


def test_migrate_makes_the_empty_file_the_store_for_its_owner_only(empty_store: Path) -> None:
    migrated = CliRunner().invoke(main, ["migrate"])
    assert (migrated.exit_code, migrated.output) == (0, f"{head_revision()}\n")
    assert stat.S_IMODE(empty_store.stat().st_mode) == 0o600
    listed = CliRunner().invoke(main, ["tasks", "list"])
    assert (listed.exit_code, listed.output) == (0, "(none)\n")
