"""A command that only reads or works on an existing store, against a SQLite path where
there is none: exit 1, one line naming the path and `taskward migrate`, and nothing
created (docs/settings.md). `migrate` and `run` still create it. Real processes.

`tasks list` made the missing directories and an empty database, then said the schema
was at nothing: the operator was left with a data directory that held no store.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.api.served import TASKWARD, process
from tests.api.test_listen_address import taskward as ended  # kills a server it started
from tests.scheduler.processes import wait_until

READERS = [["tasks", "list"], ["pair", "--token"], ["recover"], ["sweep"], ["sweeper"],
           ["serve", "--port", "0"]]


def _env(database: Path, tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    return {**clean, "TASKWARD_DATABASE_URL": f"sqlite:///{database}",
            "TASKWARD_MODELS_DIR": str(tmp_path / "models")}


@pytest.mark.parametrize("command", READERS, ids=" ".join)
@pytest.mark.parametrize("name", ["taskward.db", "no/such/dir/taskward.db"])
def test_a_missing_store_is_named_and_nothing_is_created(
        command: list[str], name: str, tmp_path: Path) -> None:
    database = tmp_path / "data" / name
    (tmp_path / "data").mkdir()
    done = ended(_env(database, tmp_path), tmp_path, *command)
    assert (done.returncode, done.stderr.splitlines()) == (1, [
        f"Error: configuration error: there is no store at {database}: run `taskward "
        "migrate` first, which creates it, or set TASKWARD_DATABASE_URL to an existing "
        "store; nothing was created"])
    assert list((tmp_path / "data").iterdir()) == []


def test_migrate_still_creates_the_store_and_its_directories(tmp_path: Path) -> None:
    database = tmp_path / "data" / "no" / "such" / "taskward.db"
    subprocess.run([TASKWARD, "migrate"], env=_env(database, tmp_path), cwd=tmp_path,
                   capture_output=True, text=True, timeout=60, check=True)
    assert database.is_file()
    done = subprocess.run([TASKWARD, "tasks", "list"], env=_env(database, tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "(none)\n")


def test_run_still_creates_the_store_and_its_directories(tmp_path: Path) -> None:
    database = tmp_path / "data" / "no" / "such" / "taskward.db"
    log = tmp_path / "run.log"
    with process(["run", "--port", "0"], _env(database, tmp_path), log):
        wait_until(lambda: "serving on" in log.read_text(), timeout=60, what="`run` serving")
    assert database.is_file()
