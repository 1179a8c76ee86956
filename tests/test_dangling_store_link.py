"""A SQLite store path that is a symbolic link to nothing (docs/settings.md): `migrate`
makes the store where the link points when that directory exists; when it does not (a
volume not mounted, a mistyped link), or one of the store's directories is such a link,
every command stops with one line naming the link, its target and what to do, and
creates nothing. It said "No such file or directory", naming neither, and refused the
link whose target it could have made."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from infra.cli import main
from infra.migrate import head_revision


def _use(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no taskward.toml of the developer's
    monkeypatch.setenv("TASKWARD_DATABASE_URL", f"sqlite:///{store}")
    monkeypatch.setenv("TASKWARD_MODELS_DIR", str(tmp_path / "models"))


def _refusal(command: list[str]) -> str:
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    return line


@pytest.mark.parametrize("command", [["migrate"], ["tasks", "list"]], ids=" ".join)
def test_a_store_linked_into_a_missing_directory_is_named_with_what_to_do(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "taskward.db"
    link.symlink_to(tmp_path / "volume" / "taskward.db")
    _use(link, tmp_path, monkeypatch)
    assert _refusal(command) == (
        f"Error: configuration error: the store {link} is a symbolic link to "
        f"{tmp_path}/volume/taskward.db, which does not exist: create the directory "
        f"{tmp_path}/volume (or mount its volume) or point the link at an existing "
        "directory, then run `taskward migrate`; nothing was created")
    assert sorted(tmp_path.iterdir()) == [link]


def test_a_store_directory_linked_to_nothing_is_named_with_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "data"
    link.symlink_to(tmp_path / "volume")
    _use(link / "sub" / "taskward.db", tmp_path, monkeypatch)
    assert _refusal(["migrate"]) == (
        f"Error: configuration error: the store's directory {link} is a symbolic link to "
        f"{tmp_path}/volume, which does not exist: create the directory {tmp_path}/volume "
        "(or mount its volume) or point the link at an existing directory, then run "
        "`taskward migrate`; nothing was created")
    assert sorted(tmp_path.iterdir()) == [link]


def test_migrate_makes_the_store_where_a_link_to_no_file_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "volume").mkdir()
    target = tmp_path / "volume" / "taskward.db"
    link = tmp_path / "taskward.db"
    link.symlink_to(target)
    _use(link, tmp_path, monkeypatch)
    migrated = CliRunner().invoke(main, ["migrate"])
    assert (migrated.exit_code, migrated.output) == (0, f"{head_revision()}\n")
    assert link.is_symlink() and target.read_bytes().startswith(b"SQLite format 3\x00")
    listed = CliRunner().invoke(main, ["tasks", "list"])
    assert (listed.exit_code, listed.output) == (0, "(none)\n")
