"""A dead letter's retry is announced to the sweepers as a request's task is: on
PostgreSQL by a NOTIFY every sweeper hears, on either store to this process's own
listeners. Unannounced, it waited for the sweepers' once-a-second poll (a retry was
claimed 353-676 ms after it was made, a POST's task within ~90 ms)."""

from __future__ import annotations

import psycopg
import pytest

from core.store import claims, new_tasks, worker_writes
from core.store.database import WORK_CHANNEL, Database
from core.store.libpq import libpq_conninfo
from tests.store.helpers import new_task, task_row


def _dead_letter(db: Database, model_id: str) -> str:
    """A task whose one attempt failed: `failed`, as `retry_failed` takes it."""
    task_id = new_task(db, model_id, max_attempts=1)
    (claimed,) = claims.claim(db, limit=1, lease_ms=30_000, node_id="node-a")
    assert claimed.task_id == task_id
    worker_writes.start_running(db, task_id, claimed.owner_token)
    worker_writes.requeue(db, task_id, claimed.owner_token, delay_ms=0, code="e", message="m")
    assert task_row(db, task_id).status == "failed"
    return task_id


def test_a_retry_is_announced_to_this_processs_listeners(db: Database, model_id: str) -> None:
    failed = _dead_letter(db, model_id)
    heard: list[str] = []
    stop = db.listen(WORK_CHANNEL, heard.append)
    try:
        new_tasks.retry_failed(db, failed, max_attempts=3)
    finally:
        stop()
    assert heard == [""]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no NOTIFY
def test_a_retry_notifies_the_sweepers_of_every_process(db: Database, model_id: str) -> None:
    failed = _dead_letter(db, model_id)
    with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as sweeper:
        sweeper.execute(f"LISTEN {WORK_CHANNEL}")  # as `PgListener` does

        new_tasks.retry_failed(db, failed, max_attempts=3)

        heard = list(sweeper.notifies(timeout=10, stop_after=1))
    assert [(notice.channel, notice.payload) for notice in heard] == [(WORK_CHANNEL, "")]
