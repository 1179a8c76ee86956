"""Retention: old finished tasks (with their events and responses), expired idempotency
keys, pairing codes and console sessions, removed in bounded batches.

Each batch is its own short transaction that removes at most its size in rows, however
many events a task has (a ten-minute generation flushed every 100 ms logs ~6,000): as
many whole tasks as fit, oldest first, or, when the oldest does not fit, the newest of
its events. A task's row and its response go in the transaction that removes its last
events, so no reader ever sees a task without the head of its log (its first events)
or a log without its task; a task half removed has lost only its newest events. Rows
are selected through indexes, so PostgreSQL never deletes millions of rows in one
statement and SQLite's write lock is released between batches. Only terminal tasks are
selected, and a terminal task never changes again.

A pass goes round the four kinds, a batch of each that has anything left per round,
until nothing is left or its time budget (`budget_s`, a share of the sweeper's
maintenance interval) is spent: a task backlog never holds up the expired keys, codes
and sessions (nor they it), and a pass removes as much as its time allows, not a fixed
number of batches, so retention keeps up with however many rows a fleet writes.

The batch size is where the two stores differ (`_Pace`). PostgreSQL writers take row
locks, and nobody writes a terminal task's rows: every batch has the configured size.
SQLite has one write lock: the size adapts to how long a batch holds it (aiming at
`TARGET_HOLD_S`), and the pass rests as long after each batch, so API writers wait for
one short batch at most and have the lock at least half the time. The size a pass ends
with is where the next pass of the process starts (a pass starting again at the full
size held the lock for up to a second each pass); the first pass of a process starts
at `START_BATCH` and grows.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
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
    batches: int = 0  # of tasks
    longest_batch_ms: float = 0.0
    finished: bool = field(default=True)


TARGET_HOLD_S = 0.040
MIN_BATCH = 50
START_BATCH = 200
# Rows a whole task costs besides its events: its own and its response's.
TASK_ROWS = 2
EXPIRING = {"idempotency_keys": idempotency_keys, "pairing_codes": pairing_codes,
            "console_sessions": console_sessions}

# One batch of a kind, given its size in rows: whether it found anything, and how long
# it held the write lock.
Batch = Callable[[int], tuple[bool, float]]


class _Pace:
    """The batch size of one database's passes in this process, and the rest after a
    batch. SQLite: adapted to the lock hold, carried from pass to pass; PostgreSQL: the
    configured size, no rest."""

    def __init__(self, adapts: bool, batch_size: int) -> None:
        self.adapts = adapts
        self.size = min(batch_size, START_BATCH) if adapts else batch_size

    def resize(self, held: float, batch_size: int) -> None:
        """Size the next batch after one that found rows and held the lock `held`
        seconds (SQLite only): towards `TARGET_HOLD_S`, by half to double at a step."""
        if self.adapts:
            aim = self.size * 2 if held <= 0 else int(self.size * TARGET_HOLD_S / held)
            bounded = max(self.size // 2, min(self.size * 2, aim))
            self.size = max(min(MIN_BATCH, batch_size), min(batch_size, bounded))

    def rest(self, held: float) -> None:
        """Leave the lock to the API's writers as long as the batch held it (SQLite)."""
        if self.adapts:
            time.sleep(held)


_paces: weakref.WeakKeyDictionary[Database, _Pace] = weakref.WeakKeyDictionary()


def _pace_of(db: Database, batch_size: int) -> _Pace:
    pace = _paces.get(db)
    if pace is None:
        pace = _paces[db] = _Pace(db.is_sqlite, batch_size)
    pace.size = min(pace.size, batch_size) if pace.adapts else batch_size
    return pace


def remove_expired(
    db: Database, *, retention_ms: int, batch_size: int, budget_s: float | None = None,
    max_batches: int | None = None, stop: threading.Event | None = None,
) -> Removed:
    """Delete what has outlived its retention in batches of at most `batch_size` rows
    (three at the least: a task's last event goes with its response and its row),
    round after round until nothing is left, `budget_s` seconds have passed (checked
    after each round, so every kind gets at least one batch a pass), or a kind has had
    `max_batches` batches, or `stop` is set (checked after each batch).

    `finished` is False when a bound stopped it early; the next pass continues.
    """
    removed = Removed()
    pace = _pace_of(db, batch_size)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    cutoff = db.clock.now_ms() - retention_ms
    now = db.clock.now_ms()

    def task_batch(size: int) -> tuple[bool, float]:
        removed.batches += 1
        return _task_batch(db, cutoff, size, removed)

    left: dict[str, Batch] = {"tasks": task_batch}
    for name, table in EXPIRING.items():
        left[name] = _expiring_batch(db, table, now, removed, name)
    batches = dict.fromkeys(left, 0)
    while left:
        for name, batch in list(left.items()):
            more, held = batch(pace.size)
            removed.longest_batch_ms = max(removed.longest_batch_ms, round(held * 1000, 1))
            batches[name] += 1
            if not more:  # an empty batch says nothing of how long a full one takes
                del left[name]
            else:
                pace.resize(held, batch_size)
                if max_batches is not None and batches[name] >= max_batches:
                    del left[name]
                    removed.finished = False
            pace.rest(held)
            if stop is not None and stop.is_set():
                break
        if left and (deadline is not None and time.monotonic() >= deadline
                     or stop is not None and stop.is_set()):
            removed.finished = False
            break
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


def _expiring_batch(db: Database, table: Table, now: int, removed: Removed,
                    name: str) -> Batch:
    """A batch of `table`'s rows expired by `now`, counted in `removed.<name>`."""
    keys = list(table.primary_key.columns)

    def batch(size: int) -> tuple[bool, float]:
        with db.write() as conn:
            began = time.perf_counter()
            rows = list(conn.execute(
                select(*keys).where(table.c.expires_at <= now).limit(size)))
            if rows:
                gone = conn.execute(delete(table).where(*_in_rows(keys, rows))).rowcount
                setattr(removed, name, getattr(removed, name) + gone)
        return bool(rows), time.perf_counter() - began

    return batch


def _in_rows(keys: list[Any], rows: list[Any]) -> list[Any]:
    """`key IN (…)`, or `(k1, k2) IN (…)` for a composite primary key."""
    if len(keys) == 1:
        return [keys[0].in_([r[0] for r in rows])]
    return [tuple_(*keys).in_([tuple(r) for r in rows])]
