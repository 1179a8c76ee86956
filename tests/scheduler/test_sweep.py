"""One sweeper pass: its steps in SPEC order and the summary it returns."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from freezegun import freeze_time

from core.settings import Settings
from core.states import OnRestart, Status
from core.store import claims
from core.store.database import Database
from core.store.tasks import cancel
from scheduler.sweep import sweep_once
from scheduler.workers import Workers
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import event_types, new_task, task_row

SUMMARY_KEYS = {"expired", "claimed", "completed", "failed", "requeued", "dead_lettered",
                "cancelled", "released", "lost", "finalised", "schedules_fired", "retention"}


def one_pass(db: Database, settings: Settings) -> dict[str, Any]:
    return sweep_once(db, settings, stop=threading.Event())


def test_a_pass_requeues_an_expired_lease_and_runs_the_task_again_in_the_same_pass(
    db: Database, fast: Settings, model_id: str
) -> None:
    with freeze_time(datetime.now(UTC)) as frozen:
        task_id = new_task(db, model_id, input="words=3")
        claims.claim(db, limit=1, lease_ms=5_000, node_id="dead-worker")
        frozen.tick(5.001)
        summary = one_pass(db, fast)
    assert set(summary) == SUMMARY_KEYS
    assert summary["expired"] == {"failed": 0, "queued": 1, "running": 0, "cancelled": 0}
    assert (summary["claimed"], summary["completed"]) == (1, 1)
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 2)


def test_a_pass_dead_letters_an_expired_task_whose_attempts_are_spent(
    db: Database, fast: Settings, model_id: str
) -> None:
    with freeze_time(datetime.now(UTC)) as frozen:
        task_id = new_task(db, model_id, max_attempts=1)
        claims.claim(db, limit=1, lease_ms=5_000, node_id="dead-worker")
        frozen.tick(4.9)
        assert one_pass(db, fast)["expired"]["queued"] == 0
        frozen.tick(0.2)
        one_pass(db, fast)
    row = task_row(db, task_id)
    assert (row.status, row.error_code, row.dead_lettered) == (
        Status.FAILED, "max_attempts_exceeded", 1)


def test_a_pass_finalises_a_task_cancelled_while_it_waited_to_be_resumed(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=1000 delay=0.01", on_restart=OnRestart.RESUME)
    workers = Workers(db, fast)
    workers.claim()
    wait_until(lambda: streamed_text(db, task_id), timeout=10, what="some output")
    workers.stop(drain_seconds=0)  # handed back: running, nobody holds it
    assert cancel(db, task_id, None).status_code == 202

    summary = one_pass(db, fast)

    assert (summary["finalised"], summary["claimed"]) == (1, 0)
    assert task_row(db, task_id).status == Status.CANCELLED
    assert event_types(db, task_id)[-1] == "response.cancelled"


def test_a_pass_removes_finished_tasks_past_retention_and_keeps_unfinished_ones(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, retention_hours=1)
    with freeze_time(datetime.now(UTC)) as frozen:
        finished = new_task(db, model_id)
        one_pass(db, settings)
        frozen.tick(3601)
        waiting = new_task(db, model_id, run_at=db.clock.now_ms() + 10_000_000)
        summary = one_pass(db, settings)
    assert summary["retention"]["tasks"] == 1
    assert event_types(db, finished) == []
    assert task_row(db, waiting).status == Status.QUEUED
