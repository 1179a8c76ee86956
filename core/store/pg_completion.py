"""Completing a batch of attempts on PostgreSQL in ONE statement.

`core.store.completion` on its own sends the pending `loading -> running` UPDATE, the
`running -> completed` UPDATE, the events INSERT and the output executemany: four
round trips besides BEGIN and COMMIT per group commit. Here the completions travel as
one JSON parameter and their events as three texts (task ids, types, data), each
event's data encoded once (encoding it apart and then the rows again was most of this
module's CPU) and none of it parsed again by the server; one UPDATE fences each task
on its own (`(id, owner_token, expected state)`, as `transitions.Held` does), bumps
`last_seq` by the task's own number of events under the row lock, and data-modifying
CTEs insert the events with the numbers that bump implies and append the output of
exactly the tasks it moved. A pending start rides along as its `response.in_progress`
event: the task's row ends `completed` with the same columns and the same log as
after the two moves. SQLite (no data-modifying CTEs, and no round trips) keeps the
separate moves.

The statement is the whole transaction, so it commits by itself
(`core.store.driver.autocommit_cursor`) on the driver's cursor: one round trip, where
BEGIN and COMMIT around it made three, and none of SQLAlchemy's work per execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    Text,
    bindparam,
    column,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import Dialect

from core.engines.base import Usage
from core.states import Status
from core.store.bulk import json_rows
from core.store.database import Database
from core.store.driver import autocommit_cursor, driver_text
from core.store.transitions import Event, encoded
from core.tables import responses, task_events, tasks


class Ending(Protocol):
    """What `core.store.completion.Completion` holds (named here, not imported: that
    module imports this one)."""

    @property
    def task_id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def closing(self) -> Sequence[Event]: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def text(self) -> str: ...
    @property
    def start(self) -> bool: ...


_STARTED = Event("response.in_progress")  # `worker_writes.start_all`'s event
_COMPLETED = Event("response.completed")


def complete_alone(db: Database, completions: Sequence[Ending]) -> set[str]:
    """Complete `completions` (each task named once) in a transaction of their own,
    committed when this returns; the ids of the tasks moved. A task not moved (its
    lease lost, a cancel requested) got no event and no output."""
    sql, constants = _driver_statement(db.engine.dialect)
    done, events = _parameters(completions)
    with autocommit_cursor(db.engine) as cursor:
        cursor.execute(sql, {**constants, "p_now": db.clock.now_ms(), "p_done": done, **events})
        [moved] = cursor.fetchone()
    return set(moved or ())


# What the events' parameters are joined with: a control character, which JSON never
# holds unescaped (`encoded` writes U+001F as `\u001f`), nor do task ids or event types.
_SEPARATOR = "\x1f"


def _parameters(completions: Sequence[Ending]) -> tuple[str, dict[str, str]]:
    """The `p_done` parameter (each completion, with its number of events and how many
    of the batch's come before them) and the events' three: every event's task id,
    type and data, each list joined by `_SEPARATOR` (`p_ids`, `p_types`, `p_data`)."""
    done: list[dict[str, Any]] = []
    ids: list[str] = []
    types: list[str] = []
    data: list[str] = []
    for c in completions:
        logged = [*([_STARTED] if c.start else []), *c.closing, _COMPLETED]
        done.append({"id": c.task_id, "owner": c.owner, "n": len(logged), "before": len(ids),
                     "expected": (Status.LOADING if c.start else Status.RUNNING).value,
                     "text": c.text, "input_tokens": c.usage.input_tokens,
                     "output_tokens": c.usage.output_tokens})
        ids += [c.task_id] * len(logged)
        types += [e.type for e in logged]
        data += [encoded(e.data) for e in logged]
    return encoded(done), {"p_ids": _SEPARATOR.join(ids), "p_types": _SEPARATOR.join(types),
                           "p_data": _SEPARATOR.join(data)}


def _statement() -> Any:
    now = bindparam("p_now", type_=BigInteger)
    given = select(*json_rows("postgresql", "p_done", [
        ("id", String()), ("owner", String()), ("expected", String()), ("n", Integer()),
        ("before", Integer()), ("text", Text()), ("input_tokens", Integer()),
        ("output_tokens", Integer()),
    ]).c).cte("given")

    def of_task(value: Any, task_id: Any) -> Any:
        return select(value).where(given.c.id == task_id).scalar_subquery()

    # Found by primary key, then fenced: never a join that could scan `tasks`.
    done = (
        update(tasks)
        .where(tasks.c.id == func.any(func.array(select(given.c.id).scalar_subquery())),
               tuple_(tasks.c.id, tasks.c.owner_token, tasks.c.status).in_(
                   select(given.c.id, given.c.owner, given.c.expected)))
        .values(status=Status.COMPLETED.value,
                last_seq=tasks.c.last_seq + of_task(given.c.n, tasks.c.id),
                updated_at=now, finished_at=now, owner_token=None, lease_expires_at=None)
        .returning(tasks.c.id, tasks.c.last_seq)
        .cte("done"))
    # Every event of the batch, cut out of its three parameters: as JSON, each event's
    # text was lexed by the server once more (JSON parsing was ~12 % of the backend's
    # CPU in a drain), where splitting at a separator only copies it. `data` is stored
    # as `encoded` wrote it. `g` is the event's place among the batch's (from 1), so a
    # task's `k`-th event is `g - before`, and its last one is numbered `last_seq`.
    sep = bindparam("p_sep", _SEPARATOR, type_=Text)
    event = func.unnest(
        *(func.string_to_array(bindparam(name, type_=Text), sep)
          for name in ("p_ids", "p_types", "p_data"))
    ).table_valued(column("id", String()), column("type", String()), column("data", Text()),
                   with_ordinality="g").render_derived(name="p_events")
    logged = insert(task_events).from_select(
        [task_events.c.task_id, task_events.c.seq, task_events.c.type,
         task_events.c.created_at, task_events.c.data],
        select(done.c.id, done.c.last_seq - given.c.n + event.c.g - given.c.before,
               event.c.type, now, event.c.data)
        .select_from(done.join(given, given.c.id == done.c.id)
                     .join(event, event.c.id == done.c.id))
    ).cte("logged")
    # `worker_writes.add_outputs`: the last text appended, the final usage set.
    task_id = responses.c.task_id
    outputs = (
        update(responses)
        .where(task_id == func.any(func.array(select(done.c.id).scalar_subquery())))
        .values(output_text=responses.c.output_text + of_task(given.c.text, task_id),
                input_tokens=of_task(given.c.input_tokens, task_id),
                output_tokens=of_task(given.c.output_tokens, task_id), updated_at=now)
        .cte("outputs"))
    return select(func.array_agg(done.c.id)).add_cte(logged, outputs)


_COMPLETE = _statement()


@cache
def _driver_statement(dialect: Dialect) -> tuple[str, dict[str, Any]]:
    return driver_text(_COMPLETE, dialect, {"p_now": 0, "p_done": "[]", "p_ids": "",
                                             "p_types": "", "p_data": ""})
