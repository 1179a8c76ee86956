"""Reading, cancelling and deleting tasks: the client-facing store operations besides
creation (`core.store.new_tasks`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, delete, select

from core.errors import Conflict, NotFound
from core.objects import response_object
from core.states import TERMINAL, Status
from core.store.database import Database
from core.store.driver import autocommit_cursor, placeholder
from core.store.pages import newest_first
from core.store.transitions import Event, move
from core.tables import IS_DEAD_LETTER, responses, status_in, status_sql, task_events, tasks

_IDS_PER_QUERY = 500  # bound parameters per statement, well inside both stores' limits


def visible(client_id: str | None) -> list[Any]:
    """The `WHERE` that keeps a client to its own tasks (None: an admin sees all)."""
    return [] if client_id is None else [tasks.c.client_id == client_id]


# What a task object shows: every column but the stored request and the resume
# snapshot, each of which can be a megabyte and neither of which a task object renders.
# Lists and task reads select these only, so reading a page never loads the bodies.
TASK_COLUMNS = tuple(c for c in tasks.c if c.key not in {"request_json", "snapshot_json"})
# What a response object shows besides: the request's echoed fields and the output.
RESPONSE_COLUMNS = (*TASK_COLUMNS, tasks.c.request_json, responses.c.output_text,
                    responses.c.input_tokens, responses.c.output_tokens)

# Built once: these are the API's hottest reads, and building a statement anew costs
# SQLAlchemy about as much as executing it.
_BY_ID = tasks.c.id == bindparam("task_id")
_OWNED = tasks.c.client_id == bindparam("client_id")
_TASK = select(*TASK_COLUMNS).where(_BY_ID)
_OWN_TASK = _TASK.where(_OWNED)
_RESPONSE = (select(*RESPONSE_COLUMNS)
             .outerjoin(responses, responses.c.task_id == tasks.c.id).where(_BY_ID))
_OWN_RESPONSE = _RESPONSE.where(_OWNED)
# A stream's page of events.
_EVENTS = (select(task_events)
           .where(task_events.c.task_id == bindparam("task_id"),
                  task_events.c.seq > bindparam("after"))
           .order_by(task_events.c.seq).limit(bindparam("limit")))


def get_task(db: Database, task_id: str, client_id: str | None) -> Row[Any]:
    """The task as a task object shows it; another client's task is `NotFound`."""
    with db.read() as conn:
        return task_in(conn, task_id, client_id)


def get_response(db: Database, task_id: str, client_id: str | None) -> Row[Any]:
    """The task with what its response object shows (request fields, output, usage)."""
    with db.read() as conn:
        return response_in(conn, task_id, client_id)


def task_in(conn: Connection, task_id: str, client_id: str | None) -> Row[Any]:
    """`get_task` inside a transaction the caller holds."""
    return _one(conn, _TASK if client_id is None else _OWN_TASK, task_id, client_id)


def response_in(conn: Connection, task_id: str, client_id: str | None) -> Row[Any]:
    """`get_response` inside a transaction the caller holds."""
    return _one(conn, _RESPONSE if client_id is None else _OWN_RESPONSE, task_id, client_id)


def _one(conn: Connection, query: Any, task_id: str, client_id: str | None) -> Row[Any]:
    row = conn.execute(query, {"task_id": task_id, "client_id": client_id}).first()
    if row is None:
        raise NotFound("task_not_found", "no such task")
    return row


def current_response(conn: Connection, task_id: str) -> dict[str, Any]:
    """The response object of a task as it stands now."""
    row = response_in(conn, task_id, None)
    return response_object(row, row)


def list_tasks(
    db: Database,
    client_id: str | None,
    *,
    status: Status | None = None,
    model: str | None = None,
    priority: int | None = None,
    dead_lettered: bool = False,
    limit: int = 20,
    after: str | None = None,
) -> tuple[list[Row[Any]], str | None]:
    """A page of tasks, newest first; the cursor is the last id of the page."""
    query = select(*TASK_COLUMNS).where(*visible(client_id))
    if status is not None:
        query = query.where(status_in(status))
    if model is not None:
        query = query.where(tasks.c.model == model)
    if priority is not None:
        query = query.where(tasks.c.priority == priority)
    if dead_lettered:
        query = query.where(IS_DEAD_LETTER)
    with db.read() as conn:
        return newest_first(conn, query, tasks.c.id, limit=limit, after=after)


def recent_models(db: Database, scanned: int) -> set[str]:
    """The models the newest `scanned` tasks name, registered or not (a removed model's
    finished tasks stay until retention takes them).

    Bounded on purpose: no index covers `model` over all tasks (`ix_tasks_model_leased`
    holds leased tasks only), so every distinct model would be a scan of the whole
    table, history included; this walks the primary key back from the newest task."""
    newest = select(tasks.c.model).order_by(tasks.c.id.desc()).limit(scanned).subquery()
    with db.read() as conn:
        return set(conn.execute(select(newest.c.model).distinct()).scalars())


@dataclass(frozen=True)
class CancelOutcome:
    status_code: int  # 200 cancelled now, 202 cancelling
    task: Row[Any]  # as `get_response` reads it: OpenAI's cancel answers a response


def cancel(db: Database, task_id: str, client_id: str | None) -> CancelOutcome:
    """One conditional transition with its event; a finished task is 409 (docs/http-api.md)."""
    with db.write() as conn:
        now = db.clock.now_ms()
        where = [tasks.c.id == task_id, *visible(client_id)]
        if move(conn, now=now, expected={Status.QUEUED}, where=where, to=Status.CANCELLED,
                events=[Event("response.cancelled")],
                values={"finished_at": now, "owner_token": None, "lease_expires_at": None}):
            return CancelOutcome(200, response_in(conn, task_id, client_id))
        if move(conn, now=now, expected={Status.LOADING, Status.RUNNING}, where=where,
                to=Status.CANCELLING, events=[Event("response.cancelling")]):
            return CancelOutcome(202, response_in(conn, task_id, client_id))
        task = response_in(conn, task_id, client_id)
        if task.status == Status.CANCELLING:
            return CancelOutcome(202, task)
    raise Conflict("task_already_finished", "the task has already finished",
                   extra={"task": task})


def delete_finished(db: Database, task_id: str, client_id: str | None) -> None:
    """Remove a finished task with its events and response; an active one is 409, and
    one another call removed first is 404: on PostgreSQL two calls both read it, and
    the second then deleted nothing yet answered as though it had."""
    with db.write() as conn:
        task = task_in(conn, task_id, client_id)
        if Status(task.status) not in TERMINAL:
            raise Conflict("task_not_finished", "only a finished response can be deleted")
        conn.execute(delete(task_events).where(task_events.c.task_id == task_id))
        conn.execute(delete(responses).where(responses.c.task_id == task_id))
        if not conn.execute(delete(tasks).where(tasks.c.id == task_id)).rowcount:
            raise NotFound("task_not_found", "no such task")


def task_and_events(
    db: Database, task_id: str, client_id: str | None, *, after: int, limit: int
) -> tuple[Row[Any], list[Row[Any]]]:
    """The task (as `get_response`: events embed the response object) and its events
    after `after`, read in one snapshot, so the events never run ahead of the task's
    `last_seq` and status."""
    with db.read() as conn:
        return response_in(conn, task_id, client_id), read_events(conn, task_id, after=after,
                                                                 limit=limit)


def read_events(
    conn: Connection, task_id: str, *, after: int = 0, limit: int = 100
) -> list[Row[Any]]:
    return list(conn.execute(_EVENTS, {"task_id": task_id, "after": after, "limit": limit}))


def log_positions(db: Database, task_ids: Sequence[str]) -> dict[str, int]:
    """`last_seq` of each listed task that still exists (one statement per
    `_IDS_PER_QUERY` of them).

    The API's live tail polls this for every stream and long-poll of its process at
    once, so following N tasks costs one indexed query per tick, not N.
    """
    return dict(_among(db, _POSITIONS, task_ids))


def cancelling_among(db: Database, task_ids: Sequence[str]) -> set[str]:
    """Which of `task_ids` are `cancelling` now (one statement per `_IDS_PER_QUERY`)."""
    return {task_id for task_id, in _among(db, _CANCELLING, task_ids)}


# The per-tick reads: of every stream (the live tail's positions, 20 a second) and of
# the lease keeper (which held tasks a cancel has reached, 10 a second). Through
# SQLAlchemy a read of 8 ids took ~180-200 us of CPU on SQLite, here ~40
# (docs/benchmarks.md, "the sixth wave"): each is a statement that commits by itself
# (`core.store.driver.autocommit_cursor`), its own snapshot, which is all a poll needs
# (`last_seq` only grows; `cancelling` never goes back).
_POSITIONS = f"SELECT {tasks.c.id.name}, {tasks.c.last_seq.name} FROM {tasks.name} WHERE"
_CANCELLING = (f"SELECT {tasks.c.id.name} FROM {tasks.name} "
               f"WHERE {status_sql(Status.CANCELLING)} AND")


def _among(db: Database, query: str, task_ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows of `query` (ending in WHERE or AND) for `task_ids`, in statements of at
    most `_IDS_PER_QUERY` ids."""
    rows: list[tuple[Any, ...]] = []
    if not task_ids:
        return rows
    mark = placeholder(db.engine.dialect)
    with autocommit_cursor(db.engine) as cursor:
        for start in range(0, len(task_ids), _IDS_PER_QUERY):
            ids = tuple(task_ids[start:start + _IDS_PER_QUERY])
            cursor.execute(f"{query} {tasks.c.id.name} IN ({', '.join([mark] * len(ids))})",
                           ids)
            rows.extend(cursor.fetchall())
    return rows
