"""Completed and failed tasks per minute over the recent past: the throughput that the
operator console draws.

One grouped read through the partial index of finished tasks (`ix_tasks_finished`,
whose predicate `IS_TERMINAL` the query repeats so the planner may use it): the cost is
the tasks finished in the window, never the retained history.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, func, select

from core.states import Status
from core.store.database import Database
from core.tables import IS_TERMINAL, status_in, tasks

MINUTE_MS = 60_000
_minute = (tasks.c.finished_at // MINUTE_MS).label("minute")
_PER_MINUTE = (
    select(_minute, tasks.c.status, func.count().label("finished"))
    .where(IS_TERMINAL, tasks.c.finished_at >= bindparam("since"),
           status_in(Status.COMPLETED, Status.FAILED))
    .group_by(_minute, tasks.c.status)
)


@dataclass(frozen=True)
class MinuteCounts:
    start_ms: int  # the minute's first millisecond (UTC)
    completed: int
    failed: int


def finished_per_minute(db: Database, now: int, minutes: int = 60) -> list[MinuteCounts]:
    """One entry per minute, oldest first, the last being the minute `now` falls in;
    minutes without finished tasks are zero."""
    last = now // MINUTE_MS
    first = last - minutes + 1
    with db.read() as conn:
        rows = list(conn.execute(_PER_MINUTE, {"since": first * MINUTE_MS}))
    counts = {(int(row.minute), row.status): row.finished for row in rows}
    return [MinuteCounts(minute * MINUTE_MS, counts.get((minute, Status.COMPLETED.value), 0),
                         counts.get((minute, Status.FAILED.value), 0))
            for minute in range(first, last + 1)]
