"""The fair line: the order in which due queued tasks are claimed.

Claims take the lowest `priority` first and, within a priority, go round-robin across
clients, oldest first within a client. That order is decided when a task becomes due,
not at claim time: the task gets a place, `vtime`, a round number. A client's next task
goes one round after its last task still in line; a client with nothing in line joins
the round being served now (the smallest place in line). So a backlog of 10,000 tasks
occupies rounds r..r+9,999, and another client's new task lands in round r, behind at
most one task of each client. The claim is then an ordinary indexed
`ORDER BY priority, vtime, id LIMIT n` (`ix_tasks_line`), whose cost does not grow with
the queue; placing costs two index probes per (client, priority) of a transaction.

A task that is not due yet (a future `run_at`, a retry's backoff) or is put back in the
queue (`core.store.transitions.move` clears `vtime`) waits outside the line, in
`ix_tasks_outside_line`, so the claim never steps over it; each claim first places the
waiting tasks that have become due (`place_due`). Two concurrent transactions may hand
one client the same round; ties go to the older id, so that costs one turn, no more.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, func, select, update

from core.store.driver import driver_cursor, driver_statement
from core.tables import IS_IN_LINE, IS_OUTSIDE_LINE, tasks

PLACED_PER_CLAIM = 64  # waiting tasks placed by one claim: more than one claim takes

_ROUND_NOW = select(func.min(tasks.c.vtime)).where(
    IS_IN_LINE, tasks.c.priority == bindparam("p_priority"))
_LAST_ROUND = select(func.max(tasks.c.vtime)).where(
    IS_IN_LINE, tasks.c.client_id == bindparam("p_client"),
    tasks.c.priority == bindparam("p_priority"))
_DUE_OUTSIDE = (
    select(tasks.c.id, tasks.c.client_id, tasks.c.priority)
    .where(IS_OUTSIDE_LINE, tasks.c.run_at <= bindparam("p_now"))
    .order_by(tasks.c.run_at, tasks.c.id)
    .limit(bindparam("p_limit"))
    .with_for_update(skip_locked=True)
)
_PLACE = (update(tasks)
          .where(tasks.c.id == bindparam("b_id"), IS_OUTSIDE_LINE)
          .values(vtime=bindparam("b_vtime")))


def places(conn: Connection, joining: Sequence[tuple[str, int]]) -> list[int]:
    """A place for each (client id, priority) joining the line, in that order: several
    of one client go to successive rounds.

    The two probes run on the driver's cursor (`core.store.driver`), compiled once:
    on SQLite they are in every batch of births, and SQLAlchemy's work around them
    was a quarter of the writer thread's CPU per batch (they cost SQLite
    microseconds)."""
    now_serving: dict[int, int] = {}
    last: dict[tuple[str, int], int] = {}
    found: list[int] = []
    round_now, last_round = (driver_statement(probe, conn.dialect)
                             for probe in (_ROUND_NOW, _LAST_ROUND))
    with driver_cursor(conn) as cursor:
        for client_id, priority in joining:
            values = {"p_client": client_id, "p_priority": priority}
            if priority not in now_serving:
                head = round_now.scalar(cursor, values)
                now_serving[priority] = 0 if head is None else head
            key = (client_id, priority)
            if key not in last:
                tail = last_round.scalar(cursor, values)
                last[key] = now_serving[priority] - 1 if tail is None else tail
            last[key] = max(now_serving[priority], last[key] + 1)
            found.append(last[key])
    return found


def place_due(conn: Connection, now: int, limit: int = PLACED_PER_CLAIM) -> int:
    """Give a place to up to `limit` waiting tasks whose time has come, earliest first;
    how many. Rows another claimer is placing are skipped (PostgreSQL)."""
    waiting = list(conn.execute(_DUE_OUTSIDE, {"p_now": now, "p_limit": limit}))
    if not waiting:
        return 0
    found = places(conn, [(row.client_id, row.priority) for row in waiting])
    conn.execute(_PLACE, [{"b_id": row.id, "b_vtime": place}
                          for row, place in zip(waiting, found)])
    return len(waiting)
