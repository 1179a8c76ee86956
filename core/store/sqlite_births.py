"""Task creation on SQLite through its driver: the model check, the tasks, their
response rows and their `response.created` events.

SQLite has no round trips to save (PostgreSQL's one statement is `core.store.pg_births`),
but SQLAlchemy's work around each statement (binding and processing every parameter,
building a result) cost several times what SQLite itself spent inserting the rows:
measured under the enqueue load, `insert_tasks` was most of the writer thread's time.
Here the same four statements are fixed texts built once from the tables and run on
the driver's cursor (`core.store.driver`), inside the caller's transaction; sqlite3
keeps them prepared. A task whose dedupe key is held is skipped (`ON CONFLICT DO
NOTHING`, told by the cursor's row count) with its response row and event, exactly as
before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection

from core.store import birth_event
from core.store.driver import driver_cursor
from core.tables import models, responses, task_events, tasks

_RESPONSE_ROW = (f"INSERT INTO {responses.name} ({responses.c.task_id.name}, "
                 f"{responses.c.output_text.name}, {responses.c.updated_at.name}) "
                 "VALUES (?, '', ?)")
_FIRST_EVENT = (f"INSERT INTO {task_events.name} ({task_events.c.task_id.name}, "
                f"{task_events.c.seq.name}, {task_events.c.type.name}, "
                f"{task_events.c.created_at.name}, {task_events.c.data.name}) "
                f"VALUES (?, {birth_event.SEQ}, '{birth_event.TYPE}', ?, '{birth_event.DATA}')")


def born_one_by_one(
    conn: Connection, rows: Sequence[Mapping[str, Any]], wanted_models: Sequence[str], now: int
) -> tuple[bool, set[str]]:
    """Insert the tasks `rows` (all with the same keys, those of `tasks.c`) with their
    response rows and first events; `(every model known, ids of the tasks inserted)`.
    Nothing is inserted when a model is unknown; a task whose dedupe key is held is
    skipped. Within `rows`, the first holding a dedupe key wins."""
    keys = tuple(rows[0])
    with driver_cursor(conn) as cursor:
        cursor.execute(_known_models(len(wanted_models)), tuple(wanted_models))
        if cursor.fetchone()[0] != len(wanted_models):
            return False, set()
        insert = _task_insert(keys)
        inserted: list[str] = []
        for row in rows:
            cursor.execute(insert, tuple(row.values()))
            if cursor.rowcount == 1:
                inserted.append(row["id"])
        if inserted:
            cursor.executemany(_RESPONSE_ROW, [(task_id, now) for task_id in inserted])
            cursor.executemany(_FIRST_EVENT, [(task_id, now) for task_id in inserted])
    return True, set(inserted)


@cache
def _known_models(count: int) -> str:
    marks = ", ".join("?" * count)
    return f"SELECT count(*) FROM {models.name} WHERE {models.c.id.name} IN ({marks})"


@cache
def _task_insert(keys: tuple[str, ...]) -> str:
    names = ", ".join(tasks.c[key].name for key in keys)
    return (f"INSERT INTO {tasks.name} ({names}) VALUES ({', '.join('?' * len(keys))}) "
            "ON CONFLICT DO NOTHING")
