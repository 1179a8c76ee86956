"""A misspelled libpq key in the database URL ends every command with one
`configuration error` line naming the key, not a driver's traceback, and never the URL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from core.settings import Settings, SettingsError
from core.store.connect import create_db_engine
from tests.api.served import TASKWARD, service_env


def _with_password(pg_url: str) -> str:
    return make_url(pg_url).set(password="hunter2").render_as_string(hide_password=False)


def test_a_misspelled_libpq_key_is_one_line_naming_it(pg_url: str, tmp_path: Path) -> None:
    url = f"{_with_password(pg_url)}?connect_timeot=5"
    done = subprocess.run([TASKWARD, "models", "list"], env=service_env(url, tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: configuration error: TASKWARD_DATABASE_URL: unknown "
                           "connection option connect_timeot "), line
    assert "hunter2" not in line and "127.0.0.1" not in line, line


def test_libpqs_own_keys_are_taken(pg_url: str) -> None:
    engine = create_db_engine(Settings(
        database_url=f"{pg_url}?connect_timeout=5&application_name=taskward_test"))
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()
    with pytest.raises(SettingsError, match="unknown connection option sslmod, keepalive "):
        create_db_engine(Settings(database_url=f"{pg_url}?sslmod=disable&keepalive=1"))
