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

A claim places at most `PLACED_PER_CLAIM` waiting tasks, so that its cost stays flat
however many are due, and it takes them round-robin across clients, each client's
earliest first (`_walk`): taken in `run_at` order across all clients, one client's
thousands of earlier-due tasks were all placed before another client's one, whose
claim came later the larger that backlog was. Each claim visits the clients that have
waiting tasks in `ix_tasks_client_outside_line` by one probe each (a loose index scan),
from the client of the earliest due task onwards and round, at most `PLACED_PER_CLAIM`
of them, and takes their due tasks turn by turn, one probe per task: every client
visited gets a place in that claim, and one client alone still gets all of them. With
more clients than that waiting, the window starts at the client whose task has waited
longest, so none waits for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    TextClause,
    bindparam,
    func,
    select,
    text,
    update,
)

from core.store.driver import driver_cursor, driver_statement
from core.tables import IS_IN_LINE, IS_OUTSIDE_LINE, tasks

PLACED_PER_CLAIM = 64  # waiting tasks placed by one claim: more than one claim takes

_ROUND_NOW = select(func.min(tasks.c.vtime)).where(
    IS_IN_LINE, tasks.c.priority == bindparam("p_priority"))
_LAST_ROUND = select(func.max(tasks.c.vtime)).where(
    IS_IN_LINE, tasks.c.client_id == bindparam("p_client"),
    tasks.c.priority == bindparam("p_priority"))
_OUTSIDE = IS_OUTSIDE_LINE.text  # the predicate of the waiting tasks' indexes
_PICKED = "(SELECT id FROM turns WHERE id IS NOT NULL LIMIT :p_limit)"
# "Still waiting", for rows found by primary key: written as a CASE, which neither store
# takes for a partial index's predicate. As a plain term, a planner with statistics
# older than the backlog chose a waiting-task index to find one row by id, and read it
# whole: the 64 UPDATEs of one placing took 0.4 s among 100,000 waiting tasks.
_STILL_WAITING = f"CASE WHEN {_OUTSIDE} THEN 1 END = 1"
_PLACE = (update(tasks)
          .where(tasks.c.id == bindparam("b_id"), text(_STILL_WAITING))
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
    """Give a place to up to `limit` waiting tasks whose time has come, round-robin
    across clients, earliest first within each; how many. Rows another claimer is
    placing are skipped (PostgreSQL).

    Whether any is due is asked first, by one probe on the driver's cursor: on SQLite
    every claim asks, and nearly always none is. On PostgreSQL the rest of the
    transaction then runs without JIT: the walk's estimated cost (ten rounds of
    recursion assumed per level) passes `jit_above_cost` with statistics older than
    the backlog, and compiling it took 30 ms where running it takes one."""
    dialect = conn.dialect.name
    with driver_cursor(conn) as cursor:
        due = driver_statement(_due_now(dialect), conn.dialect).scalar(cursor, {"p_now": now})
        if due is None:
            return 0
        if dialect == "postgresql":
            cursor.execute("SET LOCAL jit = off")
    waiting = list(conn.execute(_due_turns(dialect), {"p_now": now, "p_limit": limit}))
    if not waiting:
        return 0
    found = places(conn, [(row.client_id, row.priority) for row in waiting])
    conn.execute(_PLACE, [{"b_id": row.id, "b_vtime": place}
                          for row, place in zip(waiting, found)])
    return len(waiting)


def _probed(dialect: str, index: str) -> str:
    """`tasks` as a probe of `index` names it. SQLite is told the index (`INDEXED BY`):
    with statistics older than the backlog it chose `ix_tasks_client`, and read every
    task of a client, or sorted all the waiting ones, to find one. PostgreSQL has no
    such clause: its probes are written so that no other index serves them (`_walk`)."""
    return f"tasks INDEXED BY {index}" if dialect == "sqlite" else "tasks"


def _earliest(dialect: str) -> str:
    """The client of the earliest due waiting task (`ix_tasks_outside_line`)."""
    return (f"SELECT client_id FROM {_probed(dialect, 'ix_tasks_outside_line')} "
            f"WHERE {_OUTSIDE} AND run_at <= :p_now ORDER BY run_at, id LIMIT 1")


@cache
def _due_now(dialect: str) -> TextClause:
    """Whether any waiting task is due: `_earliest` alone."""
    return text(_earliest(dialect)).bindparams(bindparam("p_now", type_=BigInteger))


def _walk(dialect: str) -> str:
    """The walk over `ix_tasks_client_outside_line` that picks the tasks to place.

    `owners`: the clients with waiting tasks, one probe each, from the client of the
    earliest due task upwards and round: past the last client comes a row without one
    (`client_id` NULL), from which the next probe starts at the lowest client again
    (`wrapped`); the first client met again ends it, or the `:p_limit`th (`seen`, in
    which that row without a client does not count). `turns`: each visited client's
    earliest due task, then each one's next after it, turn by turn: a recursive query
    yields its rows level by level, so the LIMIT that reads it (`_PICKED`) takes whole
    turns and stops the walk there. Every step is one probe by index or primary key,
    no join. On PostgreSQL the probes order by all three columns of the index and
    bound the client by row comparisons, not `client_id = ...`: no other index yields
    that order, so none can be taken to read past other tasks to the first one that
    qualifies (`ix_tasks_outside_line` and the client indexes were, where the estimate
    of a LIMIT 1 favoured them). SQLite bounds an index scan by only the first column
    of a row comparison whose values come from the outer query, and would read every
    task of the client before the turn's: it asks twice, for the same due time and a
    later id, else for a later due time."""
    tasks_by_client = _probed(dialect, "ix_tasks_client_outside_line")
    after = "(SELECT run_at FROM tasks WHERE id = turns.id)"  # the due time of a turn's task
    if dialect == "sqlite":
        next_turn = f"""coalesce(
    (SELECT id FROM {tasks_by_client} WHERE {_OUTSIDE} AND client_id = turns.client_id
       AND run_at = {after} AND id > turns.id ORDER BY id LIMIT 1),
    (SELECT id FROM {tasks_by_client} WHERE {_OUTSIDE} AND client_id = turns.client_id
       AND run_at > {after} AND run_at <= :p_now ORDER BY run_at, id LIMIT 1))"""
    else:
        next_turn = f"""(SELECT id FROM tasks WHERE {_OUTSIDE}
    AND (client_id, run_at, id) > (turns.client_id, {after}, turns.id)
    AND (client_id, run_at) <= (turns.client_id, :p_now)
    ORDER BY client_id, run_at, id LIMIT 1)"""
    return f"""
WITH RECURSIVE owners(client_id, head, wrapped, seen) AS (
  SELECT client_id, client_id, 0, 1 FROM ({_earliest(dialect)}) AS earliest
  UNION ALL
  SELECT (SELECT client_id FROM {tasks_by_client} WHERE {_OUTSIDE}
            AND client_id > coalesce(owners.client_id, '')
            ORDER BY client_id, run_at, id LIMIT 1),
         owners.head, CASE WHEN owners.client_id IS NULL THEN 1 ELSE owners.wrapped END,
         owners.seen + 1
  FROM owners
  WHERE (owners.seen < :p_limit OR owners.client_id IS NULL)
    AND NOT (owners.wrapped = 1 AND (owners.client_id IS NULL OR owners.client_id >= owners.head))
),
turns(id, client_id, turn) AS (
  SELECT (SELECT id FROM {tasks_by_client} WHERE {_OUTSIDE} AND client_id >= owners.client_id
            AND (client_id, run_at) <= (owners.client_id, :p_now)
            ORDER BY client_id, run_at, id LIMIT 1), owners.client_id, 1
  FROM owners
  WHERE owners.client_id IS NOT NULL
    AND NOT (owners.wrapped = 1 AND owners.client_id >= owners.head)
  UNION ALL
  SELECT {next_turn}, turns.client_id, turns.turn + 1
  FROM turns
  WHERE turns.id IS NOT NULL
)"""


@cache
def _due_turns(dialect: str) -> TextClause:
    """The waiting tasks the walk picks (`_walk`), as `dialect` reads them, in `run_at`
    order (a client's several take successive rounds in that order), found by primary
    key alone (`_STILL_WAITING`; on PostgreSQL `= ANY(ARRAY(...))`, as an `IN` may be
    planned as a scan). PostgreSQL locks the rows it places, skipping those another
    claimer holds, and tests a locked row as it is once locked: one that claimer placed
    meanwhile is left out. SQLite has one writer at a time and no row locks."""
    postgresql = dialect == "postgresql"
    picked = f"= ANY(ARRAY{_PICKED})" if postgresql else f"IN {_PICKED}"
    locks = " FOR UPDATE SKIP LOCKED" if postgresql else ""
    return text(f"{_walk(dialect)}\nSELECT id, client_id, priority FROM tasks\n"
                f"WHERE id {picked} AND {_STILL_WAITING}\n"
                f"ORDER BY run_at, id{locks}").bindparams(
        bindparam("p_now", type_=BigInteger), bindparam("p_limit", type_=Integer))
