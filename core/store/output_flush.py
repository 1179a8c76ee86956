"""A worker's output flush on the driver's cursor: the fenced bump of `last_seq` with
the snapshot, the delta events it numbers, and the response's text and usage.

This is the write a streaming attempt makes every flush interval, so at 8 streams it
was most of the runner threads' CPU: through SQLAlchemy one flush cost ~450-520 us of
CPU on SQLite, here ~250, of which the commit is most (docs/benchmarks.md, "the sixth
wave"). The statements are fixed texts built once from the tables and run on the
driver's cursor inside the caller's transaction (`core.store.driver`), as
`core.store.sqlite_births` runs the births; sqlite3 and psycopg keep them prepared.
They write exactly what `transitions.move` with a `Held` target and `insert_events`
write: the same fence (id, owner, `running`), the same gapless numbers from the
bumped `last_seq`, the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection

from core.engines.base import Usage
from core.states import Status
from core.store.database import logged
from core.store.driver import driver_cursor, placeholder
from core.store.transitions import Event, insert_event_rows, numbered_rows
from core.tables import responses, status_sql, tasks


def append_events(
    conn: Connection, now: int, task_id: str, owner: str, events: Sequence[Event],
    snapshot_json: str | None,
) -> list[dict[str, Any]] | None:
    """Append `events` to the log of `task_id` while `owner` holds it `running` (and
    store `snapshot_json` if given), named for the transaction's announcement
    (`logged`); the event rows inserted, or None when the fence did not hold (nothing
    written)."""
    mark = placeholder(conn.dialect)
    with driver_cursor(conn) as cursor:
        if snapshot_json is None:
            cursor.execute(_bump(mark, False), (now, len(events), task_id, owner))
        else:
            cursor.execute(_bump(mark, True), (now, len(events), snapshot_json, task_id, owner))
        row = cursor.fetchone()
        if row is None:
            return None
        rows = numbered_rows(task_id, row[0], events, now)
        if rows:
            insert_event_rows(cursor, mark, rows)
    logged(conn, rows)
    return rows


def add_outputs(
    conn: Connection, now: int, outputs: Sequence[tuple[str, str, Usage | None]]
) -> None:
    """Append each `(task_id, text, usage)` to its response, setting the usage where
    given (a flush's latest, a completion's final); one executemany per kind."""
    mark = placeholder(conn.dialect)
    bare = [(now, text, task_id) for task_id, text, usage in outputs if usage is None]
    counted = [(now, text, usage.input_tokens, usage.output_tokens, task_id)
               for task_id, text, usage in outputs if usage is not None]
    with driver_cursor(conn) as cursor:
        for with_usage, params in ((False, bare), (True, counted)):
            if params:
                cursor.executemany(_add_output(mark, with_usage), params)


@cache
def _bump(mark: str, with_snapshot: bool) -> str:
    c = tasks.c
    snapshot = f", {c.snapshot_json.name} = {mark}" if with_snapshot else ""
    return (f"UPDATE {tasks.name} SET {c.updated_at.name} = {mark}, "
            f"{c.last_seq.name} = {c.last_seq.name} + {mark}{snapshot} "
            f"WHERE {c.id.name} = {mark} AND {c.owner_token.name} = {mark} "
            f"AND {status_sql(Status.RUNNING)} RETURNING {c.last_seq.name}")


@cache
def _add_output(mark: str, with_usage: bool) -> str:
    c = responses.c
    usage = (f", {c.input_tokens.name} = {mark}, {c.output_tokens.name} = {mark}"
             if with_usage else "")
    return (f"UPDATE {responses.name} SET {c.updated_at.name} = {mark}, "
            f"{c.output_text.name} = {c.output_text.name} || {mark}{usage} "
            f"WHERE {c.task_id.name} = {mark}")
