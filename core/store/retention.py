"""Retention: old finished tasks (with their events and responses), expired idempotency
keys, pairing codes and console sessions, removed in bounded batches.

Each batch is its own short transaction that removes at most its size in rows, however
many events a task has (a ten-minute generation flushed every 100 ms logs ~6,000): as
many whole tasks as fit, oldest first, or, when the oldest does not fit, the newest of
its events. A task's row and its response go in the transaction that removes its last
events, so no reader ever sees a task without the head of its log (its first events)
or a log without its task; a task half removed has lost only its newest events. Rows
are selected through indexes, so PostgreSQL never deletes millions of rows in one
statement and SQLite's write lock is released between batches. The batch size adapts
to how long a batch holds the lock: halved when a batch holds it longer than
`TARGET_HOLD_S`, doubled (up to the configured size) when it is well under, so API
writers never wait long behind cleanup however large the backlog or slow the disk.
Only terminal tasks are selected, and a terminal task never changes again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table, delete, func, literal, select, tuple_

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
# Rows a whole task costs besides its events: its own and its response's.
TASK_ROWS = 2


def remove_expired(
    db: Database, *, retention_ms: int, batch_size: int, max_batches: int = 1000
) -> Removed:
    """Delete what has outlived its retention, at most `max_batches` batches per call,
    each of at most `batch_size` rows (three at the least: a task's last event goes
    with its response and its row).

    `finished` is False when the bound stopped it early; the next pass continues.
    """
    removed = Removed()
    cutoff = db.clock.now_ms() - retention_ms
    size = batch_size
    while removed.batches < max_batches:
        removed.batches += 1
        more, held = _task_batch(db, cutoff, size, removed)
        removed.longest_batch_ms = max(removed.longest_batch_ms, round(held * 1000, 1))
        if held > TARGET_HOLD_S:
            size = max(min(MIN_BATCH, batch_size), size // 2)
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


def _task_batch(db: Database, cutoff: int, size: int, removed: Removed) -> tuple[bool, float]:
    """One transaction of at most `size` rows; whether it found anything to remove, and
    how long it held the write lock (from its BEGIN, the wait for its turn left out)."""
    with db.write() as conn:
        began = time.perf_counter()
        # Every task has at least its first event, so no more than a third of `size`
        # of them fit.
        oldest = conn.execute(
            select(tasks.c.id, tasks.c.last_seq)
            .where(IS_TERMINAL, tasks.c.finished_at < cutoff)
            .order_by(tasks.c.finished_at)
            .limit(max(1, size // (TASK_ROWS + 1)))
        ).all()
        if oldest:
            whole = _fitting(oldest, size)
            if not whole or not _events_within(conn, whole, size - TASK_ROWS * len(whole)):
                # The oldest alone: part of its log, or all that is left of it.
                whole = _newest_events_of(conn, oldest[0].id, max(1, size - TASK_ROWS),
                                          removed)
            _remove_tasks(conn, whole, removed)
    return bool(oldest), time.perf_counter() - began


def _fitting(oldest: Sequence[Any], size: int) -> list[str]:
    """The first tasks of `oldest` that fit in `size` rows by their `last_seq`, the
    most events a task can have (its events are numbered 1..last_seq); checked against
    the events really there before anything is deleted (`_events_within`)."""
    fitting, rows = [], 0
    for task in oldest:
        rows += task.last_seq + TASK_ROWS
        if rows > size:
            break
        fitting.append(task.id)
    return fitting


def _events_within(conn: Connection, task_ids: list[str], bound: int) -> bool:
    """Whether `task_ids` have at most `bound` events between them (reads at most
    `bound + 1` index entries)."""
    some = (select(literal(1)).select_from(task_events)
            .where(task_events.c.task_id.in_(task_ids)).limit(bound + 1).subquery())
    return bool(conn.execute(select(func.count()).select_from(some)).scalar_one() <= bound)


def _newest_events_of(conn: Connection, task_id: str, bound: int,
                      removed: Removed) -> list[str]:
    """Delete the newest `bound` events of `task_id`; `[task_id]` when it has no more
    than that, for the caller to remove whole with the rest of it."""
    floor = conn.execute(
        select(task_events.c.seq).where(task_events.c.task_id == task_id)
        .order_by(task_events.c.seq.desc()).offset(bound).limit(1)).scalar_one_or_none()
    if floor is None:
        return [task_id]
    removed.events += conn.execute(delete(task_events).where(
        task_events.c.task_id == task_id, task_events.c.seq > floor)).rowcount
    return []


def _remove_tasks(conn: Connection, task_ids: list[str], removed: Removed) -> None:
    """Delete `task_ids` whole: events, responses, task rows."""
    if not task_ids:
        return
    removed.events += conn.execute(
        delete(task_events).where(task_events.c.task_id.in_(task_ids))).rowcount
    conn.execute(delete(responses).where(responses.c.task_id.in_(task_ids)))
    removed.tasks += conn.execute(
        delete(tasks).where(tasks.c.id.in_(task_ids), IS_TERMINAL)).rowcount


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
