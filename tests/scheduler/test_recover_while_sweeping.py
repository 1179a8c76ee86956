"""On SQLite a cold-start recovery never restarts a live sweeper's work: real `taskward`
processes, the sign of life each one that runs attempts holds (`<db>.sweepers`), and a
kill -9 that takes it away with the process (docs/operations.md, "The cold-start hook").
"""

from __future__ import annotations

import subprocess

import pytest

from core.settings import Settings
from core.states import OnRestart, Status
from core.store.database import Database
from tests.engines import expected_text
from tests.scheduler.helpers import output_text, streamed_text
from tests.scheduler.processes import Children, environment, free_port, run_command, wait_until
from tests.store.helpers import assert_log_sound, event_types, new_task, task_row

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

WORDS = 60
SLOW = f"words={WORDS} delay=0.05"  # about three seconds: the checks land mid-task
REFUSED = ("Error: a sweeper is running on this store: stop it first; recovery would "
           "restart its running tasks")


def streaming_under(
    db: Database, settings: Settings, model_id: str, children: Children, *command: str
) -> tuple[dict[OnRestart, str], dict[str, str], subprocess.Popen[bytes]]:
    """`taskward COMMAND` running one slow task of each restart policy; the tasks, the
    environment of the processes, and the process."""
    env = environment(settings, worker_concurrency=3, flush_interval_ms=50)

    def one_of_each_policy() -> dict[OnRestart, str]:
        return {policy: new_task(db, model_id, input=SLOW, on_restart=policy)
                for policy in OnRestart}

    if command[0] == "run":  # it recovers first: tasks older than it would be leftovers
        process = children.start(env, *command)
        wait_until(lambda: "serving on" in children.log_of(0), timeout=30, what="run up")
        ids = one_of_each_policy()
    else:  # due before it starts, so a `sweep` pass surely finds them
        ids = one_of_each_policy()
        process = children.start(env, *command)
    wait_until(lambda: all(streamed_text(db, t) for t in ids.values()), timeout=30,
               what="all three tasks streaming")
    return ids, env, process


@pytest.mark.parametrize("command", [["sweeper"], ["sweep"], ["run", "--port", "PORT"]],
                         ids=["sweeper", "sweep", "run"])
def test_recover_is_refused_while_a_process_runs_attempts_and_leaves_its_tasks_alone(
    db: Database, settings: Settings, model_id: str, children: Children, command: list[str]
) -> None:
    ids, env, _ = streaming_under(db, settings, model_id, children,
                                  *[str(free_port()) if a == "PORT" else a for a in command])
    owners = {task_id: task_row(db, task_id).owner_token for task_id in ids.values()}

    refused = run_command(env, "recover", "--json")

    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.splitlines() == [REFUSED]
    for task_id, owner in owners.items():
        row = task_row(db, task_id)
        assert (row.status, row.owner_token) == (Status.RUNNING, owner)
    wait_until(lambda: all(task_row(db, t).status == Status.COMPLETED for t in ids.values()),
               timeout=60, what="the three tasks to complete")
    for task_id in ids.values():
        assert task_row(db, task_id).attempts == 1
        assert "response.queued" not in event_types(db, task_id)
        assert output_text(db, task_id) == expected_text(WORDS)
        assert_log_sound(db, task_id)


def test_run_beside_a_live_sweeper_skips_its_recovery_and_leaves_its_tasks_alone(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    """Its recovery would restart the sweeper's running tasks: it is skipped, and `run`
    serves (refusing would leave it down beside a sweeper or a cron pass for nothing)."""
    ids, env, _ = streaming_under(db, settings, model_id, children, "sweeper")

    children.start(env, "run", "--port", str(free_port()))

    wait_until(lambda: "serving on" in children.log_of(1), timeout=60, what="run up")
    assert "recovery skipped: a sweeper is running on this store" in children.log_of(1)
    assert {task_row(db, t).status for t in ids.values()} == {Status.RUNNING}
    wait_until(lambda: all(task_row(db, t).status == Status.COMPLETED for t in ids.values()),
               timeout=60, what="the sweeper's tasks finished")
    for task_id in ids.values():
        assert task_row(db, task_id).attempts == 1
        assert output_text(db, task_id) == expected_text(WORDS)


def test_recover_after_a_sweepers_kill_9_applies_each_tasks_restart_policy(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    ids, env, sweeper = streaming_under(db, settings, model_id, children, "sweeper")
    leases = {task_row(db, t).lease_expires_at for t in ids.values()}

    children.kill9(sweeper)
    assert min(leases) > db.clock.now_ms()  # unexpired: only the dead process tells
    done = run_command(env, "recover", "--json")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ('{"recovered": {"failed": 1, "queued": 1, '
                                   '"running": 1, "cancelled": 0}}')
    failed = task_row(db, ids[OnRestart.FAIL])
    assert (failed.status, failed.error_code) == (Status.FAILED, "server_restarted")
    assert task_row(db, ids[OnRestart.RETRY]).status == Status.QUEUED
    resumed = task_row(db, ids[OnRestart.RESUME])
    assert (resumed.status, resumed.owner_token) == (Status.RUNNING, None)
