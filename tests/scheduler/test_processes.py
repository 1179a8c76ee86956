"""Real `taskward` processes on both stores: crashes, recovery, races, graceful stop.

Children get this test's database and a models directory in tmp, load the
deterministic test engine through TASKWARD_ENGINE_MODULES, and are killed by the
`children` fixture whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from dataclasses import replace

import httpx
import pytest
from sqlalchemy import func, select

from core.settings import Settings
from core.states import OnRestart, Status
from core.store.database import Database
from core.tables import task_events, tasks
from infra.migrate import head_revision
from tests.engines import expected_text
from tests.scheduler.helpers import enqueue_many, output_text, streamed_text
from tests.scheduler.processes import (
    Children,
    environment,
    free_port,
    group_alive,
    run_command,
    run_json,
    wait_until,
)
from tests.store.helpers import assert_log_sound, force, new_task, task_row

SLOW = "words=50 delay=0.04"  # about two seconds of output: a kill lands mid-task


def api_healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def assert_back_in_the_queue(db: Database, task_id: str) -> None:
    """A `retry` task handed back at a stop: queued again, its attempt refunded."""
    queued = task_row(db, task_id)
    assert (queued.status, queued.attempts, queued.owner_token) == (Status.QUEUED, 0, None)


def assert_kept_for_resume(db: Database, task_id: str) -> None:
    """A `resume` task handed back at a stop: still running, without a lease, its
    snapshot at the end of the text it streamed."""
    kept = task_row(db, task_id)
    assert (kept.status, kept.attempts, kept.owner_token) == (Status.RUNNING, 0, None)
    assert json.loads(kept.snapshot_json)["pos"] == len(streamed_text(db, task_id).split())


def test_migrate_prints_the_schema_revision(settings: Settings) -> None:
    done = run_command(environment(settings), "migrate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == head_revision()


def test_recover_prints_exactly_the_recovered_counts_and_is_idempotent(
    db: Database, settings: Settings, model_id: str
) -> None:
    leftovers = {policy: new_task(db, model_id, on_restart=policy) for policy in OnRestart}
    for task_id in leftovers.values():
        force(db, task_id, status=Status.RUNNING.value, owner_token="gone",
              node_id=settings.node_id, lease_expires_at=db.clock.now_ms() + 60_000)
    cancelling = new_task(db, model_id)
    force(db, cancelling, status=Status.CANCELLING.value, owner_token="gone",
          node_id=settings.node_id)
    env = environment(settings)

    assert run_json(env, "recover") == {
        "recovered": {"failed": 1, "queued": 1, "running": 1, "cancelled": 1}}
    assert run_json(env, "recover") == {
        "recovered": {"failed": 0, "queued": 0, "running": 0, "cancelled": 0}}


def test_recover_on_postgresql_takes_only_this_nodes_tasks_unless_all(
    db: Database, settings: Settings, model_id: str
) -> None:
    if db.is_sqlite:
        return  # one machine: SQLite recovers everything (the test above)
    mine, theirs = new_task(db, model_id), new_task(db, model_id)
    for task_id, node in ((mine, settings.node_id), (theirs, "node-b")):
        force(db, task_id, status=Status.LOADING.value, owner_token="gone", node_id=node)
    env = environment(settings)
    assert run_json(env, "recover")["recovered"]["queued"] == 1
    assert task_row(db, theirs).status == Status.LOADING
    assert run_json(env, "recover", "--all")["recovered"]["queued"] == 1
    assert task_row(db, theirs).status == Status.QUEUED


def test_sweep_runs_one_pass_and_prints_a_one_line_summary(
    db: Database, settings: Settings, model_id: str
) -> None:
    ids = [new_task(db, model_id, input="words=4") for _ in range(3)]
    summary = run_json(environment(settings), "sweep")
    assert (summary["claimed"], summary["completed"]) == (3, 3)
    assert all(task_row(db, task_id).status == Status.COMPLETED for task_id in ids)
    # docs/cli.md: the summary is one JSON line for cron, with or without --json.
    plain = run_command(environment(settings), "sweep")
    assert plain.returncode == 0, plain.stderr
    [line] = plain.stdout.strip().splitlines()
    assert json.loads(line)["claimed"] == 0


def test_a_sweeper_killed_mid_task_leaves_it_to_lease_expiry_then_retry_or_dead_letter(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    env = environment(settings, lease_seconds=2, heartbeat_seconds=0.5, flush_interval_ms=50)
    retried = new_task(db, model_id, input=SLOW, max_attempts=3)
    spent = new_task(db, model_id, input=SLOW, max_attempts=1)
    sweeper = children.start(env, "sweeper")
    wait_until(lambda: streamed_text(db, retried) and streamed_text(db, spent), timeout=30,
               what="both tasks streaming")

    children.kill9(sweeper)
    assert task_row(db, retried).status == Status.RUNNING
    wait_until(lambda: task_row(db, retried).lease_expires_at < db.clock.now_ms(), timeout=10,
               what="lease expiry")
    summary = run_json(env, "sweep", timeout=60)

    assert summary["expired"]["queued"] == 2
    row = task_row(db, retried)
    assert (row.status, row.attempts) == (Status.COMPLETED, 2)
    assert output_text(db, retried) == expected_text(50)
    dead = task_row(db, spent)
    assert (dead.status, dead.error_code, dead.dead_lettered) == (
        Status.FAILED, "max_attempts_exceeded", 1)
    for task_id in (retried, spent):
        assert_log_sound(db, task_id)


def test_after_kill_9_of_run_recover_applies_each_tasks_restart_policy(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    env = environment(settings, worker_concurrency=3, flush_interval_ms=50)
    port = free_port()
    server = children.start(env, "run", "--port", str(port))
    wait_until(lambda: api_healthy(port), timeout=30, what="the API")
    ids = {policy: new_task(db, model_id, input=SLOW, on_restart=policy)
           for policy in OnRestart}
    wait_until(lambda: all(streamed_text(db, t) for t in ids.values()), timeout=30,
               what="all three tasks streaming")

    children.kill9(server)  # the whole process group: granian and its worker
    before_crash = streamed_text(db, ids[OnRestart.RESUME])
    assert run_json(env, "recover") == {
        "recovered": {"failed": 1, "queued": 1, "running": 1, "cancelled": 0}}
    run_json(env, "sweep", timeout=60)

    resumed = ids[OnRestart.RESUME]
    assert task_row(db, resumed).status == Status.COMPLETED
    assert output_text(db, resumed) == streamed_text(db, resumed) == expected_text(50)
    assert streamed_text(db, resumed).startswith(before_crash)
    retried = task_row(db, ids[OnRestart.RETRY])
    assert (retried.status, retried.attempts) == (Status.COMPLETED, 2)
    failed = task_row(db, ids[OnRestart.FAIL])
    assert (failed.status, failed.error_code) == (Status.FAILED, "server_restarted")
    for task_id in ids.values():
        assert_log_sound(db, task_id)


def test_two_sweepers_execute_each_of_1000_tasks_exactly_once(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    for node in ("node-1", "node-2"):
        children.start(environment(replace(settings, node_id=node),
                                   worker_concurrency=8), "sweeper")
    wait_until(lambda: all("sweeper started" in children.log_of(i) for i in (0, 1)),
               timeout=30, what="both sweepers up")
    ids = enqueue_many(db, model_id, 1000)

    def completed() -> bool:
        with db.read() as conn:
            return conn.execute(select(func.count()).where(
                tasks.c.status == Status.COMPLETED.value)).scalar_one() == len(ids)

    wait_until(completed, timeout=120, what="all tasks completed")
    with db.read() as conn:
        loading = Counter(conn.execute(select(task_events.c.task_id).where(
            task_events.c.type == "response.loading")).scalars())
        by_node = Counter(conn.execute(select(tasks.c.node_id)).scalars())
        attempts = set(conn.execute(select(tasks.c.attempts)).scalars())
    assert set(loading) == set(ids) and set(loading.values()) == {1}
    assert attempts == {1}
    assert set(by_node) == {"node-1", "node-2"}


def test_sigterm_drains_running_work_then_hands_back_the_rest(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    env = environment(settings, drain_seconds=1.5, flush_interval_ms=50)
    short = new_task(db, model_id, input="words=10 delay=0.1")
    retry = new_task(db, model_id, input="words=300 delay=0.05")
    resume = new_task(db, model_id, input="words=300 delay=0.05", on_restart=OnRestart.RESUME)
    sweeper = children.start(env, "sweeper")
    wait_until(lambda: streamed_text(db, short) and streamed_text(db, resume), timeout=30,
               what="tasks streaming")

    sweeper.send_signal(signal.SIGTERM)
    assert sweeper.wait(timeout=15) == 0

    assert task_row(db, short).status == Status.COMPLETED
    assert_back_in_the_queue(db, retry)
    assert_kept_for_resume(db, resume)


@pytest.mark.parametrize("command", ["sweeper", "sweep"])
def test_a_second_sigterm_hands_back_at_once_instead_of_waiting_out_the_drain(
    db: Database, settings: Settings, model_id: str, children: Children, command: str
) -> None:
    env = environment(settings, drain_seconds=120, flush_interval_ms=50)
    retry = new_task(db, model_id, input="words=3000 delay=0.05")
    resume = new_task(db, model_id, input="words=3000 delay=0.05", on_restart=OnRestart.RESUME)
    worker = children.start(env, command)
    wait_until(lambda: streamed_text(db, retry) and streamed_text(db, resume), timeout=30,
               what="tasks streaming")

    worker.send_signal(signal.SIGTERM)
    time.sleep(1)  # the first signal is handled: the drain has begun
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0

    assert "ending the drain now" in children.log_of(0)
    assert_back_in_the_queue(db, retry)
    assert_kept_for_resume(db, resume)


def test_a_second_ctrl_c_ends_the_drain_of_run_and_the_first_does_not(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    """Ctrl-C reaches every process of the terminal's group: granian's main process and
    its worker, which then also gets a SIGTERM from the main one; that must not pass
    for a second Ctrl-C."""
    env = environment(settings, drain_seconds=120, flush_interval_ms=50)
    task_id = new_task(db, model_id, input="words=3000 delay=0.05")
    server = children.start(env, "run", "--port", str(free_port()))
    wait_until(lambda: streamed_text(db, task_id), timeout=60, what="the task streaming")

    os.killpg(server.pid, signal.SIGINT)
    time.sleep(2)
    assert server.poll() is None, "one Ctrl-C ended the drain"
    os.killpg(server.pid, signal.SIGINT)
    assert server.wait(timeout=20) == 0

    assert "ending the drain now" in children.log_of(0)
    assert_back_in_the_queue(db, task_id)


def test_run_serves_the_api_and_stops_cleanly_on_sigterm(
    settings: Settings, children: Children
) -> None:
    port = free_port()
    server = children.start(environment(settings), "run", "--port", str(port))
    wait_until(lambda: api_healthy(port), timeout=30, what="the API")
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    assert "admin pairing code" in children.log_of(0)
    assert "registered the default model" in children.log_of(0)
    wait_until(lambda: not group_alive(server.pid), timeout=5,
               what="every process of `taskward run` to exit")
