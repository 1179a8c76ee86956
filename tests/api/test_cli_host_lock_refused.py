"""An opt-in host lock (`TASKWARD_ENGINE_HOST_LOCK`) the process cannot open stops
`sweep`, `sweeper` and `run` at start, exit 1, one line naming the setting and the
path's problem (docs/settings.md). It was taken, and the decode loop logged "host lock
… unusable: decoding without it": the lock the operator asked for was silently off.
Real `taskward` processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.api.test_cli_store_url import one_line_error, taskward

COMMANDS = [["sweep"], ["sweeper"], ["run", "--port", "0"]]
WHAT_TO_DO = "name a file this user can create or open, or leave it empty (no lock)"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_lock_in_a_directory_that_does_not_exist_stops_the_process(
        command: list[str], tmp_path: Path) -> None:
    store = tmp_path / "taskward.db"
    done = taskward(*command, cwd=tmp_path, env={
        "TASKWARD_DATABASE_URL": f"sqlite:///{store}",
        "TASKWARD_ENGINE_HOST_LOCK": "/nonexistent/dir/lock"})
    assert one_line_error(done) == (
        "TASKWARD_ENGINE_HOST_LOCK: cannot use /nonexistent/dir/lock as the lock file: "
        f"No such file or directory; {WHAT_TO_DO}")
    assert not store.exists()  # refused before the store was touched


def test_a_directory_or_fifo_is_no_lock_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    for path in (tmp_path, fifo):
        done = taskward("sweep", cwd=tmp_path, env={"TASKWARD_ENGINE_HOST_LOCK": str(path)})
        assert one_line_error(done) == (
            f"TASKWARD_ENGINE_HOST_LOCK: cannot use {path} as the lock file: it is not a "
            f"regular file; {WHAT_TO_DO}")


def test_a_lock_set_in_taskward_toml_is_named_by_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "taskward.toml").write_text('engine_host_lock = "/nonexistent/dir/lock"\n')
    assert one_line_error(taskward("sweeper", cwd=tmp_path)) == (
        "taskward.toml: engine_host_lock: cannot use /nonexistent/dir/lock as the lock "
        f"file: No such file or directory; {WHAT_TO_DO}")


def test_a_usable_lock_is_made_and_the_pass_runs(tmp_path: Path) -> None:
    env = {"TASKWARD_DATABASE_URL": f"sqlite:///{tmp_path / 'taskward.db'}"}
    assert taskward("migrate", cwd=tmp_path, env=env).returncode == 0
    lock = tmp_path / "engine.lock"
    done = taskward("sweep", cwd=tmp_path, env={**env, "TASKWARD_ENGINE_HOST_LOCK": str(lock)})
    assert done.returncode == 0, done.stderr
    assert lock.is_file()


def test_operator_commands_never_open_the_lock(tmp_path: Path) -> None:
    """They run no attempts: a lock path of the sweepers' host is none of their business."""
    env = {"TASKWARD_DATABASE_URL": f"sqlite:///{tmp_path / 'taskward.db'}",
           "TASKWARD_ENGINE_HOST_LOCK": "/nonexistent/dir/lock"}
    assert taskward("migrate", cwd=tmp_path, env=env).returncode == 0
    done = taskward("tasks", "list", cwd=tmp_path, env=env)
    assert (done.returncode, done.stdout) == (0, "(none)\n"), done.stderr
