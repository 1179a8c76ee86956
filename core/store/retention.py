"""Retention: old finished tasks (with their events and responses), expired idempotency
keys, pairing codes and console sessions, removed in bounded batches.

Each batch is its own short transaction, selected through an index on an indexed
column, so PostgreSQL never deletes millions of rows in one statement and SQLite's
write lock is released between batches. The batch size adapts to how long a batch
holds the lock: halved when a batch takes longer than `TARGET_HOLD_S`, doubled (up to
the configured size) when it is well under, so API writers never wait long behind
cleanup however large the backlog or slow the disk. Only terminal tasks are selected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, delete, select, tuple_

from core.store.database import Database
from core.tables import (
    IS_TERMINAL,
    console_sessions,
    idempotency_keys,
    pairing_codes,
    responses,
    task_events,
    tasks,
)


@dataclass
class Removed:
    tasks: int = 0
    events: int = 0
    idempotency_keys: int = 0
    pairing_codes: int = 0
    console_sessions: int = 0
    batches: int = 0
    longest_batch_ms: float = 0.0
    finished: bool = field(default=True)


TARGET_HOLD_S = 0.040
MIN_BATCH = 50


def remove_expired(
    db: Database, *, retention_ms: int, batch_size: int, max_batches: int = 1000
) -> Removed:
    """Delete what has outlived its retention, at most `max_batches` batches per call.

    `finished` is False when the bound stopped it early; the next pass continues.
    """
    removed = Removed()
    cutoff = db.clock.now_ms() - retention_ms
    size = min(batch_size, 500)
    while removed.batches < max_batches:
        removed.batches += 1
        began = time.perf_counter()
        more = _task_batch(db, cutoff, size, removed)
        held = time.perf_counter() - began
        removed.longest_batch_ms = max(removed.longest_batch_ms, round(held * 1000, 1))
        if held > TARGET_HOLD_S:
            size = max(MIN_BATCH, size // 2)
        elif held < TARGET_HOLD_S / 4:
            size = min(batch_size, size * 2)
        if not more:
            break
    else:
        removed.finished = False
        return removed
    now = db.clock.now_ms()
    removed.idempotency_keys = _expired(db, idempotency_keys, now, batch_size, max_batches)
    removed.pairing_codes = _expired(db, pairing_codes, now, batch_size, max_batches)
    removed.console_sessions = _expired(db, console_sessions, now, batch_size, max_batches)
    return removed


def _task_batch(db: Database, cutoff: int, batch_size: int, removed: Removed) -> bool:
    with db.write() as conn:
        ids = list(conn.execute(
            select(tasks.c.id)
            .where(IS_TERMINAL, tasks.c.finished_at < cutoff)
            .order_by(tasks.c.finished_at)
            .limit(batch_size)
        ).scalars())
        if not ids:
            return False
        removed.events += conn.execute(
            delete(task_events).where(task_events.c.task_id.in_(ids))).rowcount
        conn.execute(delete(responses).where(responses.c.task_id.in_(ids)))
        removed.tasks += conn.execute(
            delete(tasks).where(tasks.c.id.in_(ids), IS_TERMINAL)).rowcount
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
