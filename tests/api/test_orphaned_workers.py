"""kill -9 of the main process of `taskward serve` (or `run`) alone, as the OOM killer
or a shell's `kill -9 <pid>` does, leaving its granian workers behind: they stop by
themselves within a few seconds (`infra.parent_watch`), freeing the port for a restart.
Before, they went on answering on that port for ever, and a restart was refused."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from pathlib import Path

import pytest

from core.settings import Settings
from tests.api.served import process, service_env, wait_ready
from tests.scheduler.processes import free_port, group_alive, wait_until


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the store is not the point
@pytest.mark.parametrize("command", [["serve", "--workers", "2"], ["run"]], ids=["serve", "run"])
def test_workers_stop_once_their_main_process_is_killed_and_the_port_serves_again(
        settings: Settings, tmp_path: Path, command: list[str]) -> None:
    env = service_env(settings.database_url, settings.models_dir)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        first_log = tmp_path / "first.log"
        first = stack.enter_context(process([*command, "--port", str(port)], env, first_log))
        wait_ready(base_url, first, first_log)
        os.kill(first.pid, signal.SIGKILL)  # the main process alone, not its group
        first.wait(timeout=10)
        wait_until(lambda: not group_alive(first.pid), timeout=15,
                   what="the orphaned workers to stop")
        assert f"the server's main process (pid {first.pid}) is gone" in first_log.read_text()
        second_log = tmp_path / "second.log"
        second = stack.enter_context(process([*command, "--port", str(port)], env, second_log))
        wait_ready(base_url, second, second_log)
