"""Retention: old finished tasks (with their events and responses), expired idempotency
keys and pairing codes, removed in bounded batches.

Each batch is its own short transaction, selected through an index on an indexed
column, so SQLite's write lock is held for milliseconds and PostgreSQL never deletes
millions of rows in one statement. Only terminal tasks are ever selected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any

from sqlalchemy import Table, delete, select, tuple_

from core.states import TERMINAL
from core.store.database import Database
from core.tables import idempotency_keys, pairing_codes, responses, task_events, tasks


@dataclass
class Removed:
    tasks: int = 0
    events: int = 0
    idempotency_keys: int = 0
    pairing_codes: int = 0
    batches: int = 0
    finished: bool = field(default=True)


def remove_expired(
    db: Database, *, retention_ms: int, batch_size: int, max_batches: int = 1000
) -> Removed:
    """Delete what has outlived its retention, at most `max_batches` batches per call.

    `finished` is False when the bound stopped it early; the next pass continues.
    """
    removed = Removed()
    cutoff = db.clock.now_ms() - retention_ms
    while removed.batches < max_batches:
        removed.batches += 1
        if not _task_batch(db, cutoff, batch_size, removed):
            break
    else:
        removed.finished = False
        return removed
    now = db.clock.now_ms()
    removed.idempotency_keys = _expired(db, idempotency_keys, now, batch_size, max_batches)
    removed.pairing_codes = _expired(db, pairing_codes, now, batch_size, max_batches)
    return removed


def _task_batch(db: Database, cutoff: int, batch_size: int, removed: Removed) -> bool:
    with db.write() as conn:
        ids = list(conn.execute(
            select(tasks.c.id)
            .where(tasks.c.status.in_([s.value for s in TERMINAL]),
                   tasks.c.finished_at < cutoff)
            .order_by(tasks.c.finished_at)
            .limit(batch_size)
        ).scalars())
        if not ids:
            return False
        removed.events += conn.execute(
            delete(task_events).where(task_events.c.task_id.in_(ids))).rowcount
        conn.execute(delete(responses).where(responses.c.task_id.in_(ids)))
        removed.tasks += conn.execute(
            delete(tasks).where(tasks.c.id.in_(ids),
                                tasks.c.status.in_([s.value for s in TERMINAL]))).rowcount
        return True


def _expired(db: Database, table: Table, now: int, batch_size: int, max_batches: int) -> int:
    total = 0
    for _ in range(max_batches):
        with db.write() as conn:
            keys = list(table.primary_key.columns)
            rows = list(conn.execute(
                select(*keys).where(table.c.expires_at <= now).limit(batch_size)))
            if not rows:
                break
            total += conn.execute(
                delete(table).where(*_in_rows(keys, rows))).rowcount
    return total


def _in_rows(keys: list[Any], rows: list[Any]) -> list[Any]:
    """`key IN (…)`, or `(k1, k2) IN (…)` for a composite primary key."""
    if len(keys) == 1:
        return [keys[0].in_([r[0] for r in rows])]
    return [tuple_(*keys).in_([tuple(r) for r in rows])]
