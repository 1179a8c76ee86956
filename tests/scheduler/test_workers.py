"""Execution slots and the graceful stop of one worker process."""

from __future__ import annotations

import json

from core.settings import Settings
from core.states import OnRestart, Status
from core.store.database import Database
from scheduler.attempt import Outcome
from scheduler.workers import Workers
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import event_types, events_of, new_task, task_row

LONG = "words=1000 delay=0.01"


def test_a_claim_takes_no_more_tasks_than_there_are_free_slots(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = fast.model_copy(update={"worker_concurrency": 2})
    ids = [new_task(db, model_id, input=LONG) for _ in range(5)]
    workers = Workers(db, settings)
    try:
        assert workers.claim() == 2
        assert workers.claim() == 0
        statuses = [task_row(db, task_id).status for task_id in ids]
        assert statuses.count(Status.QUEUED) == 3
    finally:
        workers.stop(drain_seconds=0)


def test_graceful_stop_lets_work_finish_until_the_deadline_then_hands_back_the_rest(
    db: Database, fast: Settings, model_id: str
) -> None:
    short = new_task(db, model_id, input="words=5 delay=0.05")
    retry = new_task(db, model_id, input=LONG)
    resume = new_task(db, model_id, input=LONG, on_restart=OnRestart.RESUME)
    workers = Workers(db, fast)
    assert workers.claim() == 3
    wait_until(lambda: streamed_text(db, resume), timeout=10, what="resume task output")

    workers.stop(drain_seconds=1)

    assert workers.outcomes == {Outcome.COMPLETED: 1, Outcome.RELEASED: 2}
    assert task_row(db, short).status == Status.COMPLETED
    queued = task_row(db, retry)
    assert (queued.status, queued.attempts, queued.owner_token) == (Status.QUEUED, 0, None)
    assert json.loads(events_of(db, retry)[-1].data)["reason"] == "released"
    kept = task_row(db, resume)
    assert (kept.status, kept.attempts, kept.owner_token) == (Status.RUNNING, 0, None)
    assert json.loads(kept.snapshot_json)["pos"] == len(streamed_text(db, resume).split())
    assert "response.queued" not in event_types(db, resume)
