"""The store's files are readable by their owner only (SQLite; PostgreSQL keeps its own).

Run under the usual umask 022, which would leave them 0755/0644 by themselves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from core.settings import Settings, SettingsError
from core.store.connect import open_database
from infra.migrate import upgrade


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_store_is_created_owner_only_with_its_wal_and_shm(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        database = tmp_path / "var" / "taskward.db"
        db = open_database(Settings(database_url=f"sqlite:///{database}"))
        upgrade(db.engine)
        with db.write() as conn:  # a write leaves the -wal and -shm files in place
            conn.execute(text("CREATE TABLE probe (x INTEGER)"))
        files = {p.name: mode(p) for p in database.parent.iterdir()}
        db.dispose()
    finally:
        os.umask(previous)
    assert mode(database.parent) == 0o700
    assert {"taskward.db", "taskward.db-wal", "taskward.db-shm"} <= files.keys()
    assert set(files.values()) == {0o600}, files


def test_an_existing_world_readable_store_is_narrowed(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir(mode=0o755)
    database = tmp_path / "data" / "taskward.db"
    database.touch()
    database.chmod(0o644)
    open_database(Settings(database_url=f"sqlite:///{database}")).dispose()
    assert mode(database) == 0o600
    assert mode(database.parent) == 0o755  # a directory we did not create is the operator's


def test_the_systemd_units_set_an_owner_only_umask() -> None:
    units = sorted((Path(__file__).parents[1] / "infra" / "deploy").glob("*.service"))
    assert units
    for unit in units:
        assert "\nUMask=0077\n" in unit.read_text(), unit.name


def test_a_file_that_is_not_a_sqlite_database_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    model = tmp_path / "good.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    model.chmod(0o644)
    with pytest.raises(SettingsError, match=r"good\.gguf, a file that is not a SQLite "
                                            "database, not a taskward store; nothing"):
        open_database(Settings(database_url=f"sqlite:///{model}"))
    assert mode(model) == 0o644 and model.read_bytes() == b"GGUF" + bytes(60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.gguf"]


@pytest.mark.parametrize("kind", ["a FIFO", "a directory"])
def test_what_is_no_file_is_refused_unopened(tmp_path: Path, kind: str) -> None:
    # A FIFO opened for reading would block; a device may act on being opened.
    target = tmp_path / "store"
    if kind == "a FIFO":
        os.mkfifo(target, 0o644)
    else:
        target.mkdir(0o755)
    with pytest.raises(SettingsError, match=f"store, {kind}, not a taskward store"):
        open_database(Settings(database_url=f"sqlite:///{target}"))
    assert mode(target) == (0o644 if kind == "a FIFO" else 0o755)


def test_an_existing_store_of_any_size_is_taken(tmp_path: Path) -> None:
    database = tmp_path / "taskward.db"
    db = open_database(Settings(database_url=f"sqlite:///{database}"))
    upgrade(db.engine)
    db.dispose()
    database.chmod(0o644)
    open_database(Settings(database_url=f"sqlite:///{database}")).dispose()
    assert database.read_bytes().startswith(b"SQLite format 3\x00") and mode(database) == 0o600


def test_a_store_in_a_directory_it_cannot_be_made_in_is_named_with_what_to_do(
    tmp_path: Path,
) -> None:
    occupied = tmp_path / "occupied"
    occupied.write_text("a file where the store's directory should be")
    database = occupied / "taskward.db"
    with pytest.raises(SettingsError) as refused:
        open_database(Settings(database_url=f"sqlite:///{database}"))
    assert str(refused.value) == (f"cannot create the store {database}: Not a directory; "
                                  "set TASKWARD_DATABASE_URL to a path this user can use")
