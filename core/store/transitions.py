"""The one primitive that moves tasks: a conditional UPDATE plus its events, together.

`move` takes the target state (or None for "events only"), the states the caller
expects the task(s) to be in, and extra `WHERE` conditions such as the owner token.
It checks the expected states against `core.states.TRANSITIONS`, bumps `last_seq` by
the number of events in the same statement, and inserts the events with the numbers
that bump implies. The row lock of the UPDATE serialises writers of one task on both
stores, so `seq` is gapless; zero rows returned means the condition did not hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ClauseElement, ColumnElement, Connection, Row, bindparam, insert, update

from core.errors import ForbiddenTransition
from core.states import Status, is_allowed
from core.tables import task_events, tasks


@dataclass(frozen=True)
class Event:
    """An event to append: its type and its own fields (no type/sequence_number)."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


EventsFor = Callable[[Row[Any]], Sequence[Event]]


@dataclass(frozen=True)
class Held:
    """The fencing condition of a worker's write: this task, held by this owner token.

    Passed as `where`, it lets `move` use a prepared statement: the worker's writes are
    the hottest path, and building an UPDATE anew costs SQLAlchemy as much as running it.
    """

    task_id: str
    owner: str

RETURNED = (
    tasks.c.id,
    tasks.c.status,
    tasks.c.last_seq,
    tasks.c.attempts,
    tasks.c.max_attempts,
    tasks.c.run_at,
    tasks.c.owner_token,
    tasks.c.on_restart,
)


def move(
    conn: Connection,
    *,
    now: int,
    expected: Iterable[Status],
    where: Sequence[ColumnElement[bool]] | Held,
    to: Status | None,
    events: EventsFor | Sequence[Event],
    values: dict[str, Any] | None = None,
) -> list[Row[Any]]:
    """Move every task matching `where` and `expected` to `to`, appending its events.

    `events` is a list (the same for every row) or a function of the returned row when
    the data differs per task (attempt numbers, say). The per-row event count must be
    the same for all rows, since `last_seq` is bumped in one set-based statement.
    Returns the updated rows (post-update values of `RETURNED`).
    """
    expected = frozenset(expected)
    if to is not None:
        forbidden = [s for s in expected if not is_allowed(s, to)]
        if forbidden:
            raise ForbiddenTransition(
                "forbidden_transition", f"{forbidden[0]} -> {to} is not a task transition"
            )
    count = len(events) if not callable(events) else None
    if count is None:
        count = _event_count(events)
    values = values or {}
    if isinstance(where, Held) and not any(isinstance(v, ClauseElement) for v in values.values()):
        statement = _prepared_fenced_update(expected, to, tuple(sorted(values)))
        params = {f"v_{key}": value for key, value in values.items()}
        rows = list(conn.execute(statement, {**params, "p_now": now, "p_count": count,
                                             "p_task_id": where.task_id,
                                             "p_owner": where.owner}))
    else:
        conditions = _held(where) if isinstance(where, Held) else list(where)
        changes: dict[str, Any] = {"updated_at": now, "last_seq": tasks.c.last_seq + count}
        if to is not None:
            changes["status"] = to.value
        changes.update(values)
        statement = (
            update(tasks)
            .where(tasks.c.status.in_([s.value for s in expected]), *conditions)
            .values(**changes)
            .returning(*RETURNED)
        )
        rows = list(conn.execute(statement))
    if rows and count:
        conn.execute(_INSERT_EVENTS, list(_event_rows(rows, events, count, now)))
    return rows


_INSERT_EVENTS = insert(task_events)
_prepared: dict[tuple[frozenset[Status], Status | None, tuple[str, ...]], Any] = {}


def _held(held: Held) -> list[ColumnElement[bool]]:
    return [tasks.c.id == held.task_id, tasks.c.owner_token == held.owner]


def _prepared_fenced_update(
    expected: frozenset[Status], to: Status | None, keys: tuple[str, ...]
) -> Any:
    """The fenced UPDATE for one (expected, target, value columns) shape, built once."""
    shape = (expected, to, keys)
    statement = _prepared.get(shape)
    if statement is None:
        changes: dict[str, Any] = {"updated_at": bindparam("p_now"),
                                   "last_seq": tasks.c.last_seq + bindparam("p_count")}
        if to is not None:
            changes["status"] = to.value
        changes.update({key: bindparam(f"v_{key}") for key in keys})
        statement = _prepared[shape] = (
            update(tasks)
            .where(tasks.c.id == bindparam("p_task_id"),
                   tasks.c.owner_token == bindparam("p_owner"),
                   tasks.c.status.in_(sorted(s.value for s in expected)))
            .values(**changes)
            .returning(*RETURNED)
        )
    return statement


def _event_count(events_for: EventsFor) -> int:
    # Functions declare their count through an attribute set by `per_row`.
    return int(getattr(events_for, "count"))


def per_row(count: int) -> Callable[[EventsFor], EventsFor]:
    """Mark an events function with how many events it yields for every row."""

    def mark(function: EventsFor) -> EventsFor:
        function.count = count  # type: ignore[attr-defined]
        return function

    return mark


def _event_rows(
    rows: list[Row[Any]], events: EventsFor | Sequence[Event], count: int, now: int
) -> Iterable[dict[str, Any]]:
    for row in rows:
        batch = events(row) if callable(events) else events
        if len(batch) != count:
            raise ValueError("an events function yielded a different number of events")
        first = row.last_seq - count + 1
        for offset, item in enumerate(batch):
            yield {
                "task_id": row.id,
                "seq": first + offset,
                "type": item.type,
                "created_at": now,
                "data": json.dumps(item.data, separators=(",", ":"), ensure_ascii=False),
            }
