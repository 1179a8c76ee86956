"""Opening a SQLite store only narrows its mode: group and other permissions go, and
none is added, so a store the operator made read-only stays read-only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from core.settings import Settings
from core.store.connect import create_db_engine


@pytest.mark.parametrize(("before", "after"), [
    (0o444, 0o400),  # a restored backup kept read-only: it had been made 0600, writable
    (0o644, 0o600),
    (0o640, 0o600),
    (0o400, 0o400),
    (0o600, 0o600),
], ids=lambda mode: f"{mode:o}")
def test_an_existing_store_file_is_narrowed_never_widened(
        tmp_path: Path, before: int, after: int) -> None:
    database = tmp_path / "taskward.db"
    database.touch()
    database.chmod(before)
    create_db_engine(Settings(database_url=f"sqlite:///{database}")).dispose()
    assert stat.S_IMODE(database.stat().st_mode) == after
