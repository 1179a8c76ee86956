"""The one primitive that moves tasks: a conditional UPDATE plus its events, together.

`move` takes the target state (or None for "events only"), the states the caller
expects the task(s) to be in, and extra `WHERE` conditions such as the owner token.
It checks the expected states against `core.states.TRANSITIONS`, bumps `last_seq` by
the number of events in the same statement, and inserts the events with the numbers
that bump implies. The row lock of the UPDATE serialises writers of one task on both
stores, so `seq` is gapless; zero rows returned means the condition did not hold.
A task moved back to `queued` leaves the fair line (`core.store.line`) and is placed
again once it is due.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import msgspec
from sqlalchemy import (
    BindParameter,
    ClauseElement,
    ColumnElement,
    Connection,
    Row,
    TextClause,
    bindparam,
    func,
    tuple_,
    update,
)

from core.errors import ForbiddenTransition
from core.states import DEAD_LETTER_ERROR, Status, is_allowed
from core.store.bulk import insert_rows
from core.store.database import logged
from core.store.driver import driver_cursor, placeholder
from core.tables import task_events, tasks

# A WHERE term: an expression, or one of the literal partial-index predicates of
# `core.tables` (text, so that the index can serve the query).
Condition = ColumnElement[bool] | TextClause


@dataclass(frozen=True)
class Event:
    """An event to append: its type and its own fields (no type/sequence_number)."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PerRow:
    """Events that differ per moved task (attempt numbers, say): `count` events from
    `make(row)` for every row. The count is declared up front because `last_seq` is
    bumped by it in the one set-based UPDATE, before any row is seen."""

    count: int
    make: Callable[[Row[Any]], Sequence[Event]]


@dataclass(frozen=True)
class Held:
    """The fencing condition of worker writes: tasks, each held by its own owner token.

    Several pairs make one set-based write (`id IN ids AND (id, owner) IN pairs`: the
    first term lets SQLite use the primary key, the second is the exact fence); a task
    id may appear only once, since the rows returned tell the moved tasks apart by id.
    """

    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def one(cls, task_id: str, owner: str) -> Held:
        return cls(((task_id, owner),))

    def __post_init__(self) -> None:
        if len({task_id for task_id, _ in self.pairs}) != len(self.pairs):
            raise ValueError("a task id appears twice in one fenced write")


@dataclass(frozen=True)
class Locked:
    """Tasks this transaction has already selected `FOR UPDATE` (a claim's candidates)."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class Add:
    """A value for `move`: the column plus `amount` (`attempts + 1`, say)."""

    amount: int


@dataclass(frozen=True)
class IfNull:
    """A value for `move`: the column's own value, or `value` where it is NULL."""

    value: Any


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
    where: Sequence[Condition] | Held | Locked,
    to: Status | None,
    events: PerRow | Sequence[Event],
    values: dict[str, Any] | None = None,
    event_rows: list[dict[str, Any]] | None = None,
) -> list[Row[Any]]:
    """Move every task matching `where` and `expected` to `to`, appending its events.

    `events` is a list (the same for every row) or a `PerRow` when the data differs per
    task.
    `values` may hold plain values, `Add`, `IfNull` or SQL expressions.
    Returns the updated rows (post-update values of `RETURNED`).
    `event_rows`: collect the event rows there instead of inserting them now; the
    caller inserts them (`insert_events`) later in the SAME transaction, which still
    holds the rows' locks, so several moves of one transaction cost one insert.

    A `Held` or `Locked` target with no SQL expression among the values runs a
    statement built once per shape and reused: these are the worker's and the claim's
    writes, the hottest path, and building an UPDATE anew costs SQLAlchemy as much as
    running it.
    """
    expected = frozenset(expected)
    if to is not None:
        forbidden = [s for s in expected if not is_allowed(s, to)]
        if forbidden:
            raise ForbiddenTransition(
                "forbidden_transition", f"{forbidden[0]} -> {to} is not a task transition"
            )
    count = events.count if isinstance(events, PerRow) else len(events)
    values = values or {}
    params: dict[str, Any] = {"p_now": now, "p_count": count}
    params.update({f"v_{key}": _param(value) for key, value in values.items()
                   if not isinstance(value, ClauseElement)})
    target: _Target | None = None
    conditions: list[Condition] = []
    if isinstance(where, (Held, Locked)):
        target, target_params = _target(where)
        params.update(target_params)
    else:
        conditions = list(where)
    if target is not None and not any(isinstance(v, ClauseElement) for v in values.values()):
        statement = _prepared_update(expected, to, target,
                                     tuple(sorted((k, type(v)) for k, v in values.items())))
    else:
        if target is not None:
            conditions = _conditions(target)
        statement = _update(expected, to, conditions, {
            key: value if isinstance(value, ClauseElement) else _change(key, type(value))
            for key, value in values.items()})
    rows = list(conn.execute(statement, params))
    if rows and count:
        made = list(_event_rows(rows, events, count, now))
        if event_rows is None:
            insert_events(conn, made)
        else:
            event_rows.extend(made)
    return rows


def encoded(data: Any) -> str:
    """An event's data as the log stores it: compact UTF-8 JSON, also the JSON of the
    completions a batch sends (`core.store.pg_completion`). Called for every event of
    every attempt, so msgspec writes it: a no-op task's eight events took 19 us with
    the standard library's C encoder and 4 with msgspec; a drain's sweepers spent
    ~12 % less CPU per task (docs/benchmarks.md, twenty-seventh wave).

    The text is what `json.dumps(data, separators=(",", ":"), ensure_ascii=False)`
    writes for strings, integers, booleans, None, lists and dicts, byte for byte; a
    float is written as the shortest text that reads back as the same float, with
    msgspec's exponent form (`1e16`, where `json.dumps` writes `1e+16`), and one that is
    not finite as null (`json.dumps` writes `NaN`, which no JSON parser reads)."""
    return _ENCODER.encode(data).decode()


_ENCODER = msgspec.json.Encoder()


def insert_events(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert event rows that `move` collected (`numbered_rows`), and name them for the
    transaction's announcement (`logged`).

    On SQLite the rows go to the driver's `executemany` (`core.store.driver`): through
    SQLAlchemy, processing each row's parameters was the largest single cost of a
    drain's completions there (a no-op task logs eight events); the columns need no
    conversion, so the driver is given what SQLAlchemy would have passed it. PostgreSQL
    takes several rows as one statement (`insert_rows`), a round trip instead of many."""
    if conn.dialect.name == "sqlite" and rows:
        with driver_cursor(conn) as cursor:
            insert_event_rows(cursor, placeholder(conn.dialect), rows)
    else:
        insert_rows(conn, task_events, rows)
    logged(conn, rows)


def insert_event_rows(cursor: Any, mark: str, rows: Sequence[dict[str, Any]]) -> None:
    """Event rows (`numbered_rows`) inserted on a driver `cursor` whose
    parameter mark is `mark`: one executemany."""
    cursor.executemany(_event_insert(mark), [
        (row["task_id"], row["seq"], row["type"], row["created_at"], row["data"])
        for row in rows])


@cache
def _event_insert(mark: str) -> str:
    c = task_events.c
    names = ", ".join(col.name for col in (c.task_id, c.seq, c.type, c.created_at, c.data))
    return f"INSERT INTO {task_events.name} ({names}) VALUES ({', '.join([mark] * 5)})"


_Target = Literal["one", "held", "locked"]  # one held task, several, claimed ones
_prepared: dict[tuple[frozenset[Status], Status | None, _Target, tuple[Any, ...]], Any] = {}


def _target(where: Held | Locked) -> tuple[_Target, dict[str, Any]]:
    """The shape of a `Held` / `Locked` condition and its parameters."""
    if isinstance(where, Locked):
        return "locked", {"p_ids": list(where.ids)}
    if len(where.pairs) == 1:
        [(task_id, owner)] = where.pairs
        return "one", {"p_task_id": task_id, "p_owner": owner}
    return "held", {"p_ids": [task_id for task_id, _ in where.pairs],
                    "p_pairs": list(where.pairs)}


def _conditions(target: _Target) -> list[Condition]:
    """The `Held` / `Locked` condition over the parameters `_target` names."""
    if target == "one":
        return [tasks.c.id == bindparam("p_task_id"), tasks.c.owner_token == bindparam("p_owner")]
    ids = tasks.c.id.in_(bindparam("p_ids", expanding=True))
    if target == "locked":
        return [ids]
    return [ids, tuple_(tasks.c.id, tasks.c.owner_token).in_(bindparam("p_pairs", expanding=True))]


def _change(key: str, kind: type) -> Any:
    """The SET expression for a value of `kind`, bound to the parameter `v_<key>`."""
    value: BindParameter[Any] = bindparam(f"v_{key}")
    if kind is Add:
        return tasks.c[key] + value
    if kind is IfNull:
        return func.coalesce(tasks.c[key], value)
    return value


def _param(value: Any) -> Any:
    if isinstance(value, Add):
        return value.amount
    if isinstance(value, IfNull):
        return value.value
    return value


def _update(
    expected: frozenset[Status], to: Status | None, conditions: list[Condition],
    changes: dict[str, Any],
) -> Any:
    values: dict[str, Any] = {"updated_at": bindparam("p_now"),
                              "last_seq": tasks.c.last_seq + bindparam("p_count")}
    if to is not None:
        values["status"] = to.value
    if to is Status.QUEUED:  # back in the queue: it waits to be placed in line anew
        values["vtime"] = None
    values.update(changes)
    return (
        update(tasks)
        .where(*conditions, tasks.c.status.in_(sorted(s.value for s in expected)))
        .values(**values)
        .returning(*RETURNED)
    )


def _prepared_update(
    expected: frozenset[Status], to: Status | None, target: _Target,
    values: tuple[tuple[str, type], ...],
) -> Any:
    """The UPDATE for one (expected, target state, where, value columns and kinds)
    shape, built once."""
    shape = (expected, to, target, values)
    statement = _prepared.get(shape)
    if statement is None:
        statement = _prepared[shape] = _update(
            expected, to, _conditions(target), {key: _change(key, kind) for key, kind in values})
    return statement


def _event_rows(
    rows: list[Row[Any]], events: PerRow | Sequence[Event], count: int, now: int
) -> Iterable[dict[str, Any]]:
    for row in rows:
        batch = events.make(row) if isinstance(events, PerRow) else events
        if len(batch) != count:
            raise ValueError("a PerRow made a different number of events than it declared")
        yield from numbered_rows(row.id, row.last_seq, batch, now)


def numbered_rows(
    task_id: str, last_seq: int, events: Sequence[Event], now: int
) -> list[dict[str, Any]]:
    """The event rows of `events` for `task_id`, numbered so the last is `last_seq` (the
    task's `last_seq` after a bump by `len(events)`): the one shape `insert_event_rows`
    and the announcement (`logged`) take."""
    first = last_seq - len(events) + 1
    return [{"task_id": task_id, "seq": first + offset, "type": event.type,
             "created_at": now, "data": encoded(event.data)}
            for offset, event in enumerate(events)]


def dead_letter(conn: Connection, now: int, where: Held | Locked, *, expected: Status,
                error: dict[str, str] = DEAD_LETTER_ERROR) -> int:
    """Fail tasks whose attempts are spent, marked as dead letters, with `error`; how
    many."""
    return len(move(conn, now=now, expected={expected}, where=where, to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": True})],
                    values={"finished_at": now, "owner_token": None, "lease_expires_at": None,
                            "error_code": error["code"], "error_message": error["message"],
                            "dead_lettered": 1}))
