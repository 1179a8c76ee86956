"""A `taskward.toml` in the working directory that is there but is no regular file
stops start-up with one line naming it (docs/settings.md: one that "cannot be read").

A directory (or a FIFO, or a link to nothing) of that name was taken for no file at
all: the operator's settings were ignored, and every command went on with the defaults.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from core.settings import SettingsError, load_settings
from tests.api.served import TASKWARD


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "lease_seconds").write_text("40\n")  # what an operator may have meant


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opened, it would wait for a writer that never comes


def _dangling_link(path: Path) -> None:
    path.symlink_to(path.with_name("moved.toml"))


@pytest.fixture(autouse=True)
def here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in list(os.environ):
        if key.upper().startswith("TASKWARD_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("make", "said"), [
    (_directory, "{path} is not a regular file"),
    (_fifo, "{path} is not a regular file"),
    (_dangling_link, "No such file or directory"),
], ids=["directory", "fifo", "dangling-link"])
def test_a_taskward_toml_that_is_no_regular_file_stops_start_up(
        make: Callable[[Path], None], said: str, here: Path) -> None:
    path = here / "taskward.toml"
    make(path)
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == "taskward.toml: cannot read it: " + said.format(path=path)


def test_a_command_started_beside_a_taskward_toml_directory_exits_1_naming_it(
        here: Path) -> None:
    _directory(here / "taskward.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    done = subprocess.run([TASKWARD, "tasks", "list"], env=env, cwd=here,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.splitlines()) == (1, [
        f"Error: configuration error: taskward.toml: cannot read it: {here}/taskward.toml "
        "is not a regular file"])
    assert list(here.iterdir()) == [here / "taskward.toml"]  # no store was made either
