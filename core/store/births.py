"""Births: the rows of new tasks, written the one way every task is born.

`core.store.new_tasks` (a client's request, the API's group commit, a dead letter's
retry) and schedule firing create tasks through `insert_tasks`: the models checked, the
task rows with their response rows and `response.created` events, each due task placed
in the fair line. PostgreSQL does it in one statement (`core.store.pg_births`), which
commits by itself where the births are the whole transaction (`insert_rows_alone`, and
`insert_rows_alone_async` on the API's event loop); SQLite through the driver's own
prepared statements (`core.store.sqlite_births`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect

from core.errors import InvalidInput
from core.ids import sortable_id
from core.priorities import DEFAULT_PRIORITY
from core.states import OnRestart, Status
from core.store.database import Database
from core.store.driver import autocommit_cursor, driver_cursor
from core.store.line import places
from core.store.pg_async import AutocommitConnections
from core.store.pg_births import births_answer, births_query, line_offsets
from core.store.sqlite_births import born_one_by_one


@dataclass(frozen=True)
class NewTask:
    """A task to create: its owner, model and validated request (stored as JSON)."""

    client_id: str
    model: str
    request_json: str
    on_restart: OnRestart = OnRestart.RETRY
    max_attempts: int = 3
    run_at: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    dedupe_key: str | None = None
    schedule_id: str | None = None
    retry_of: str | None = None
    priority: int = DEFAULT_PRIORITY
    max_active: int = 0  # the client's `max_active_tasks` (0: not checked)


def insert_task(db: Database, conn: Connection, new: NewTask, now: int) -> SimpleNamespace | None:
    """One task through `insert_tasks`; None on a dedupe conflict."""
    return insert_tasks(db, conn, [new], now)[0]


def insert_tasks(
    db: Database, conn: Connection, news: Sequence[NewTask], now: int, *, announce: bool = False
) -> list[SimpleNamespace | None]:
    """Insert tasks with their response rows and first events: one answer per request,
    None where an active task holds its dedupe key.

    Shared by `enqueue`, retries of dead letters and schedule firing, so every task is
    born the same way: the models are checked (an unknown one refuses the whole batch
    before anything is written), the tasks go in with `ON CONFLICT DO NOTHING` (the ids
    of the rows inserted come back, matched by id, not position: they are made here),
    then their response rows and `response.created` events. On PostgreSQL that is one
    statement, one round trip (`core.store.pg_births`); on SQLite the driver's own
    prepared statements (`core.store.sqlite_births`).
    Within a batch as between batches, the first request holding a dedupe key wins. A
    past `run_at` is kept as given: the task is due at once, and a schedule's task
    carries its slot. A due task takes its place in the fair line (`core.store.line`);
    a later one waits outside it. `announce`: tell the sweepers
    (`Database.announce_work`) when a task was created. Each answer is the new task's
    columns (with empty response columns), enough to render it without a read-back.
    """
    if not news:
        return []
    rows = [_task_values(new, now) for new in news]
    if db.data_modifying_ctes:  # one round trip: `core.store.pg_births`
        with driver_cursor(conn) as cursor:
            inserted = _born_at_once(cursor, conn.dialect, rows, now, notify=announce)
    else:
        due = [row for row in rows if row["run_at"] <= now]
        for row, place in zip(due, places(conn, [(row["client_id"], row["priority"])
                                                 for row in due])):
            row["vtime"] = place
        known, inserted = born_one_by_one(conn, rows, _models_of(rows), now)
        if not known:
            raise _unknown_model()
    if announce and inserted:
        db.announce_work(conn, notified=db.data_modifying_ctes)
    return _births(rows, inserted)


def task_rows(news: Sequence[NewTask], now: int) -> list[dict[str, Any]]:
    """The rows `news` are to be born with, their ids made: what a caller renders or
    records before `insert_rows_alone` writes them (`as_born`)."""
    return [_task_values(new, now) for new in news]


def as_born(rows: Sequence[dict[str, Any]]) -> list[SimpleNamespace]:
    """Each of `task_rows`' rows as its task will read once born (empty response
    columns): enough to render it."""
    return [task for task in _births(rows, {row["id"] for row in rows}) if task is not None]


def insert_rows_alone(
    db: Database, rows: list[dict[str, Any]], now: int,
    records: Sequence[Mapping[str, Any]] = (),
) -> set[str]:
    """`task_rows(…, now)`'s rows (and `records`, idempotency records:
    `core.store.pg_births`) inserted by one statement that commits by itself; the ids
    of the tasks inserted.

    That statement commits by itself (`core.store.driver.autocommit_cursor`): one
    round trip, where a transaction around it adds BEGIN and COMMIT, and none of
    SQLAlchemy's transaction bookkeeping. For requests whose whole transaction is the
    births, as it is without `max_active`.
    """
    with autocommit_cursor(db.engine) as cursor:
        cursor.execute(*_births_query(db.engine.dialect, rows, now, notify=True,
                                      records=records))
        inserted = _inserted(rows, cursor.fetchone())
    if inserted:
        db.announce_committed_work()
    return inserted


async def insert_rows_alone_async(
    db: Database, connections: AutocommitConnections, rows: list[dict[str, Any]], now: int,
    records: Sequence[Mapping[str, Any]] = (),
) -> set[str]:
    """`insert_rows_alone` on the event loop, on one of `connections`
    (`core.store.pg_async`): the API's group commit, without a thread hop."""
    answer = await connections.first_row(*_births_query(connections.dialect, rows, now,
                                                         notify=True, records=records))
    # Read once the connection is back: a refusal (an unknown model) is no fault of it.
    inserted = _inserted(rows, answer)
    if inserted:
        db.announce_committed_work()
    return inserted


def _born_at_once(
    cursor: Any, dialect: Dialect, rows: list[dict[str, Any]], now: int, *, notify: bool
) -> set[str]:
    """`core.store.pg_births`' statement for `rows` on a driver cursor; the ids
    inserted."""
    cursor.execute(*_births_query(dialect, rows, now, notify=notify))
    return _inserted(rows, cursor.fetchone())


def _births_query(
    dialect: Dialect, rows: list[dict[str, Any]], now: int, *, notify: bool,
    records: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, dict[str, Any]]:
    """The births statement for `rows`, each due row given its offset in the line."""
    due = [row for row in rows if row["run_at"] <= now]
    for row, offset in zip(due, line_offsets([(row["client_id"], row["priority"])
                                              for row in due])):
        row["vtime"] = offset
    return births_query(dialect, rows, _models_of(rows), now, notify=notify,
                        records=records)


def _inserted(rows: list[dict[str, Any]], answer: Sequence[Any]) -> set[str]:
    """The ids the births statement inserted (each row given its place, or None);
    `model_not_found` when it inserted nothing for want of a model."""
    known, placed = births_answer(answer, _models_of(rows))
    if not known:
        raise _unknown_model()
    for row in rows:
        row["vtime"] = placed.get(row["id"])
    return set(placed)


def _models_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({row["model"] for row in rows})


def _unknown_model() -> InvalidInput:
    return InvalidInput("model_not_found", "no model is registered under that id",
                        extra={"field": "model"})


def _births(rows: Sequence[dict[str, Any]], inserted: set[str]) -> list[SimpleNamespace | None]:
    """Each new task's columns (with empty response columns), enough to render it
    without a read-back; None where it was not inserted."""
    return [SimpleNamespace(**row, output_text="", input_tokens=0, output_tokens=0)
            if row["id"] in inserted else None for row in rows]


_QUEUED = Status.QUEUED.value


def _task_values(new: NewTask, now: int) -> dict[str, Any]:
    """A new task's row. Built for every request on the event loop: most requests
    carry no metadata, and `json.dumps` of an empty dict costs a microsecond."""
    metadata = json.dumps(new.metadata, separators=(",", ":")) if new.metadata else "{}"
    return {
        "id": sortable_id("resp", now), "client_id": new.client_id, "model": new.model,
        "status": _QUEUED, "on_restart": new.on_restart.value, "attempts": 0,
        "max_attempts": new.max_attempts, "created_at": now, "updated_at": now,
        "run_at": now if new.run_at is None else new.run_at,
        "started_at": None, "finished_at": None, "owner_token": None,
        "lease_expires_at": None, "node_id": None, "last_seq": 1,
        "dedupe_key": new.dedupe_key, "error_code": None, "error_message": None,
        "dead_lettered": 0, "metadata_json": metadata,
        "request_json": new.request_json, "snapshot_json": None,
        "schedule_id": new.schedule_id, "retry_of": new.retry_of,
        "priority": new.priority, "vtime": None,
    }
