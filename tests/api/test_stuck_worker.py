"""A granian worker that does not stop when told (deadlocked, here frozen with SIGSTOP)
is killed once its drain and `STOP_MARGIN_SECONDS` have passed, so a stop of `serve`
or `run` ends: granian waited for it without a bound, and a `taskward run` whose worker
deadlocked in granian's signal handler (~1 Ctrl-C in 6, seen by a red team) never ended,
holding the SQLite store's sign of a live sweeper."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from core.settings import Settings
from infra.server import STOP_MARGIN_SECONDS
from tests.api.served import process, service_env, wait_ready
from tests.scheduler.processes import free_port, group_alive, wait_until

DRAIN_SECONDS = 1


def _children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the store is not the point
# `run`'s worker drains its sweeper first; `serve`'s has no drain.
@pytest.mark.parametrize(("command", "allowed"), [
    (["serve"], STOP_MARGIN_SECONDS), (["run"], DRAIN_SECONDS + STOP_MARGIN_SECONDS),
], ids=["serve", "run"])
def test_a_stop_ends_when_a_worker_will_not(
        settings: Settings, tmp_path: Path, command: list[str], allowed: int) -> None:
    env = {**service_env(settings.database_url, settings.models_dir),
           "TASKWARD_DRAIN_SECONDS": str(DRAIN_SECONDS)}
    port = free_port()
    log = tmp_path / "server.log"
    with ExitStack() as stack:
        server = stack.enter_context(process([*command, "--port", str(port)], env, log))
        wait_ready(f"http://127.0.0.1:{port}", server, log)
        [worker] = _children(server.pid)
        os.kill(worker, signal.SIGSTOP)  # as deaf to its SIGTERM as a deadlocked one
        began = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=allowed + 10)
        except subprocess.TimeoutExpired:
            pytest.fail("the stop waited for the frozen worker")
        assert time.monotonic() - began >= allowed - 0.5
        wait_until(lambda: not group_alive(server.pid), timeout=10, what="the worker killed")
        assert "Killing worker-1 after it refused to gracefully stop" in log.read_text()
