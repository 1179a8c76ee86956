"""The store's files are readable by their owner only (SQLite; PostgreSQL keeps its own).

Run under the usual umask 022, which would leave them 0755/0644 by themselves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy import text

from core.settings import Settings
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
