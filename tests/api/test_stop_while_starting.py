"""`taskward run` told to stop while its granian worker is still starting.

The worker builds its app before granian sets its signal handlers, and runs the app's
startup hooks (the sweeper's start among them) before it serves. A SIGTERM in either
window was lost: the sweeper started and claimed, granian's worker never left its serve,
and it was killed once the drain plus granian's margin had passed, its task left
`running` as after a crash. The worker is paused at each point
(`tests.api.worker_start_pause`) and signalled there, to its main process alone (as
`kill <pid>` does) or to the whole group (as systemd does).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.api.worker_start_pause import PAUSE
from tests.scheduler.processes import Children, environment, free_port, wait_until
from tests.store.helpers import new_task, task_row

DRAIN_SECONDS = 30  # a stop that waits out the drain (or is killed after it) fails
STOP_SECONDS = 15


@pytest.mark.parametrize("target", ["main", "group"])
@pytest.mark.parametrize("point", ["factory", "startup"])
def test_a_stop_while_the_worker_starts_ends_run_at_once_and_claims_nothing(
    db: Database, settings: Settings, model_id: str, tmp_path: Path, point: str, target: str
) -> None:
    task_id = new_task(db, model_id, input="words=3000 delay=0.05")
    env = {**environment(settings, drain_seconds=DRAIN_SECONDS),
           "TASKWARD_ENGINE_MODULES": "tests.engines,tests.api.worker_start_pause",
           PAUSE: f"{point}:{tmp_path}", "PYTHONUNBUFFERED": "1"}
    children = Children(tmp_path / "logs")
    try:
        run = children.start(env, "run", "--port", str(free_port()))
        wait_until(lambda: (tmp_path / "paused").exists() or run.poll() is not None,
                   timeout=60, what="the worker to pause in its start")
        assert run.poll() is None, children.log_of(0)
        if target == "group":
            os.killpg(run.pid, signal.SIGTERM)
        else:
            run.send_signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        try:
            code = run.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`taskward run` still running {STOP_SECONDS} s after "
                                 f"SIGTERM:\n{children.log_of(0)[-3000:]}") from None
        log = children.log_of(0)
    finally:
        children.kill_all()
    # Signalled as a group, the worker may end before granian's main process has
    # handled its own signal; granian then calls it an unexpected exit, exit 1.
    assert code == 0 or (target == "group" and "Unexpected exit from worker-1" in log), log
    assert "refused to gracefully stop" not in log
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.QUEUED, 0), log
