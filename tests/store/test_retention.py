"""Retention removes only what is finished and old, in bounded batches."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from freezegun import freeze_time
from sqlalchemy import Table, event, func, select

from core.idempotency import IdempotencyClaim
from core.store import births, claims, new_tasks, tasks, worker_writes
from core.store.database import Database
from core.store.retention import remove_expired
from core.store.transitions import Event
from core.tables import idempotency_keys, responses, task_events
from core.tables import tasks as tasks_table
from tests.store.helpers import events_of, new_task, task_row

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
        # A task is four rows (two events, its response, itself).
        removed = remove_expired(db, retention_ms=HOUR, batch_size=8)
    assert removed.tasks == 5 and removed.events == 10 and removed.finished
    assert removed.batches == 4  # three of at most two tasks, then one that finds nothing
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
        first = remove_expired(db, retention_ms=HOUR, batch_size=8, max_batches=1)
        assert (first.tasks, first.finished) == (2, False)
        rest = remove_expired(db, retention_ms=HOUR, batch_size=8)
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


def running_with_events(db: Database, model_id: str, deltas: int) -> tuple[str, str]:
    """A running task (and its owner token) that logged `deltas` output events (a long
    generation's flushes), its log as the real operations write it."""
    task_id = new_task(db, model_id)
    (claimed,) = claims.claim(db, limit=1, lease_ms=60_000, node_id="n")
    worker_writes.append_output(
        db, task_id, claimed.owner_token,
        [Event("response.output_text.delta", {"delta": "w "}) for _ in range(deltas)],
        text="w " * deltas, start=True)
    return task_id, claimed.owner_token


def finished_with_events(db: Database, model_id: str, deltas: int) -> str:
    """`running_with_events`, then failed."""
    task_id, owner = running_with_events(db, model_id, deltas)
    worker_writes.fail(db, task_id, owner, "engine_error", "it broke")
    return task_id


@contextmanager
def rows_deleted_per_transaction(db: Database) -> Iterator[list[int]]:
    """The rows each committed transaction deleted, in order (those that deleted any)."""
    counts: list[int] = []
    pending = [0]

    def after_execute(_conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        if sql.lstrip().upper().startswith("DELETE"):
            pending[0] += max(cursor.rowcount, 0)

    def committed(_conn: Any) -> None:
        if pending[0]:
            counts.append(pending[0])
        pending[0] = 0

    event.listen(db.engine, "after_cursor_execute", after_execute)
    event.listen(db.engine, "commit", committed)
    try:
        yield counts
    finally:
        event.remove(db.engine, "after_cursor_execute", after_execute)
        event.remove(db.engine, "commit", committed)


def log_and_rows(db: Database, task_id: str) -> tuple[Any, ...]:
    """Everything stored of a task: its row, its response, its log."""
    with db.read() as conn:
        response = conn.execute(select(responses).where(responses.c.task_id == task_id)).one()
    return tuple(task_row(db, task_id)), tuple(response), [tuple(e) for e in events_of(db, task_id)]


def test_a_task_with_more_events_than_a_batch_goes_over_several_bounded_transactions(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        long_run = finished_with_events(db, model_id, deltas=95)
        unfinished, _ = running_with_events(db, model_id, deltas=30)  # old, still running
    with freeze_time("2026-01-01 02:00:00"):
        young = finished_with_events(db, model_id, deltas=30)
        kept = {task_id: log_and_rows(db, task_id) for task_id in (unfinished, young)}
        logged = len(events_of(db, long_run))
        with rows_deleted_per_transaction(db) as deleted:
            removed = remove_expired(db, retention_ms=HOUR, batch_size=10)

    assert (removed.tasks, removed.events, removed.finished) == (1, logged, True)
    assert max(deleted) <= 10 and len(deleted) >= logged // 10
    assert sum(deleted) == logged + 2  # its events, its response, its row
    assert count(db, tasks_table) == 2
    assert {task_id: log_and_rows(db, task_id) for task_id in kept} == kept


def test_a_task_half_removed_keeps_its_row_response_and_the_head_of_its_log(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-01-01 00:00:00"):
        long_run = finished_with_events(db, model_id, deltas=95)
    before = events_of(db, long_run)
    with freeze_time("2026-01-01 02:00:00"):
        first = remove_expired(db, retention_ms=HOUR, batch_size=10, max_batches=3)

    assert (first.tasks, first.events, first.finished) == (0, 24, False)  # 8 a batch
    assert events_of(db, long_run) == before[:-24]
    assert task_row(db, long_run).status == "failed" and count(db, responses) == 1


def test_the_bound_holds_for_a_log_longer_than_its_last_seq_says(
    db: Database, model_id: str
) -> None:
    # `last_seq` only picks which tasks may go whole; the events really there decide.
    with freeze_time("2026-01-01 00:00:00"):
        short = [finished_with_events(db, model_id, deltas=1) for _ in range(3)]
    with db.write() as conn:  # rows written behind the store's back (a restore, a backfill)
        conn.execute(task_events.insert(), [
            {"task_id": short[0], "seq": 1000 + n, "type": "response.output_text.delta",
             "created_at": 0, "data": "{}"} for n in range(30)])
    with freeze_time("2026-01-01 02:00:00"), rows_deleted_per_transaction(db) as deleted:
        removed = remove_expired(db, retention_ms=HOUR, batch_size=20)

    assert removed.tasks == 3 and count(db, task_events) == 0
    assert max(deleted) <= 20
