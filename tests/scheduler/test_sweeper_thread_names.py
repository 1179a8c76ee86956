"""A real sweeper's threads, seen from outside the process as an operator sees them
(`top -H -p PID`, /proc/PID/task/*/comm): each duty under its own name."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from core.store.database import Database
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import Children, environment, wait_until
from tests.store.helpers import new_task


def _kernel_names(pid: int) -> set[str]:
    names = set()
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.add((thread / "comm").read_text().rstrip("\n"))
        except OSError:  # ended while we looked
            continue
    return names


def test_a_running_sweeper_shows_each_thread_under_its_duty(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    env = environment(settings, flush_interval_ms=50)
    task_id = new_task(db, model_id, input="words=200 delay=0.05")
    sweeper = children.start(env, "sweeper")
    wait_until(lambda: streamed_text(db, task_id), timeout=30, what="the task streaming")

    names = _kernel_names(sweeper.pid)

    assert {"claimer", "lease-keeper", "maintenance", "handoff", "engine", "streams"} <= names, \
        names
