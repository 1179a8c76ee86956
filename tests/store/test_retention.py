"""Retention removes only what is finished and old, in bounded batches."""

from __future__ import annotations

from freezegun import freeze_time
from sqlalchemy import Table, func, select

from core.idempotency import IdempotencyClaim
from core.store import births, new_tasks, tasks
from core.store.database import Database
from core.store.retention import remove_expired
from core.tables import idempotency_keys, responses, task_events
from core.tables import tasks as tasks_table
from tests.store.helpers import new_task

HOUR = 3600 * 1000


def count(db: Database, table: Table) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_old_finished_tasks_go_with_their_events_and_responses(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        old = [new_task(db, model_id) for _ in range(5)]
        for task_id in old:
            tasks.cancel(db, task_id, None)
    with freeze_time("2026-01-01 02:00:00"):
        recent = new_task(db, model_id)
        tasks.cancel(db, recent, None)
        removed = remove_expired(db, retention_ms=HOUR, batch_size=2)
    assert removed.tasks == 5 and removed.events == 10 and removed.finished
    assert removed.batches == 4  # three of at most two, then one that finds nothing
    assert count(db, tasks_table) == 1 and count(db, responses) == 1
    assert count(db, task_events) == 2


def test_unfinished_tasks_are_never_removed_however_old(db: Database, model_id: str) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        new_task(db, model_id)
    with freeze_time("2027-01-01 00:00:00"):
        removed = remove_expired(db, retention_ms=HOUR, batch_size=100)
    assert removed.tasks == 0 and count(db, tasks_table) == 1


def test_a_bounded_pass_says_it_did_not_finish(db: Database, model_id: str) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        for _ in range(5):
            tasks.cancel(db, new_task(db, model_id), None)
    with freeze_time("2026-01-02 00:00:00"):
        first = remove_expired(db, retention_ms=HOUR, batch_size=2, max_batches=1)
        assert (first.tasks, first.finished) == (2, False)
        rest = remove_expired(db, retention_ms=HOUR, batch_size=2)
    assert rest.tasks == 3 and count(db, tasks_table) == 0


def test_expired_idempotency_keys_are_removed(db: Database, model_id: str) -> None:
    new = births.NewTask(client_id="c", model=model_id, request_json="{}")
    with freeze_time("2026-01-01 00:00:00"):
        new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("old", "d"),
                          idempotency_ttl_ms=HOUR)
        new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("new", "d"),
                          idempotency_ttl_ms=10 * HOUR)
    with freeze_time("2026-01-01 02:00:00"):
        removed = remove_expired(db, retention_ms=HOUR, batch_size=10)
    assert removed.idempotency_keys == 1
    with db.read() as conn:
        assert list(conn.execute(select(idempotency_keys.c.key)).scalars()) == ["new"]
