"""The claim of local-engine work on PostgreSQL in ONE statement.

`core.store.claims` on its own sends, per claim, a read of the upstream limits, the
search for waiting tasks now due (`core.store.line.place_due`), the resumable and the
queued candidates (`FOR UPDATE SKIP LOCKED`), the UPDATE of
`core.store.transitions.move`, the events INSERT and the output reset: seven round
trips besides BEGIN and COMMIT, and on PostgreSQL those round trips, not the work,
bound how fast a sweeper drains short tasks. Here the same candidates, in the same
order and with the same locks, are selected, moved, dead-lettered, logged and reset
by data-modifying CTEs of one statement, with the same values and event rows as
`move` writes: `last_seq` is bumped by the UPDATE that holds the row lock and each
event takes the number that bump implies, so the log stays gapless. The local pool
excludes upstream models by a subquery instead of a list read beforehand; the one
row that always comes back also says whether upstream models exist, so the caller
reads their limits (and claims their pool, `core.store.capacity`) only then.
Each claimed row also brings its model's registry entry (a join by primary key), so
the model check at the task's start reads nothing in a transaction of its own.
SQLite (no data-modifying CTEs, and no round trips) keeps the separate statements.

When that one statement is the whole claim, as it nearly always is (no waiting task
due, no upstream model to claim for), it is its own transaction (`claim_alone`): it
commits by itself on the driver's cursor (`core.store.driver.autocommit_cursor`), one
round trip where BEGIN and COMMIT around it made three, and none of SQLAlchemy's work.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Connection, Integer, Row, String, Text, bindparam, text
from sqlalchemy.engine import Dialect

from core.states import DEAD_LETTER_ERROR, Status
from core.store.database import Database
from core.store.driver import autocommit_cursor, driver_text
from core.store.line import place_due
from core.store.models import ENTRY_COLUMNS, ModelEntry
from core.store.transitions import encoded


def claim_local(
    conn: Connection, *, now: int, limit: int, owner: str, lease_until: int, node_id: str
) -> tuple[list[Row[Any]], bool]:
    """Claim up to `limit` due tasks of local models (resumable first, then the fair
    line), dead-lettering those whose attempts are spent; (the rows claimed, whether
    any upstream model exists). The rows have the fields `claims.Claim` is made of,
    and their model's registry entry (`model_entry`).

    Waiting tasks whose time has come get their places in the line first
    (`core.store.line.place_due`), but asking whether any did is part of the claim:
    when none did, which is nearly always, the claim is this one statement; when one
    did, the statement claims nothing, the tasks are placed and the line is claimed."""
    params = _params(now, limit, owner, lease_until, node_id)
    rows = conn.execute(_CLAIM[True], params).all()
    if rows[0].waiting:  # their places first, as `claims.claim` does: then the line
        place_due(conn, now)
        rows = conn.execute(_CLAIM[False], params).all()
    return _taken(rows), bool(rows[0].upstream_models)


def claim_alone(
    db: Database, *, now: int, limit: int, owner: str, lease_until: int, node_id: str
) -> tuple[list[Any], bool, bool]:
    """`claim_local`'s first statement as a transaction of its own, committed when this
    returns: (the rows claimed, whether a waiting task is due, whether any upstream
    model exists). When a waiting task is due it claimed nothing: the caller claims in
    a transaction (`claim_local`), which places the waiting tasks first."""
    from psycopg.rows import namedtuple_row  # here: SQLite processes never load psycopg

    sql, constants = _driver_statement(db.engine.dialect)
    with autocommit_cursor(db.engine) as cursor:
        cursor.row_factory = namedtuple_row
        cursor.execute(sql, {**constants, **_params(now, limit, owner, lease_until, node_id)})
        rows = cursor.fetchall()
    return _taken(rows), bool(rows[0].waiting), bool(rows[0].upstream_models)


def _params(now: int, limit: int, owner: str, lease_until: int, node_id: str) -> dict[str, Any]:
    """The claim statement's parameters (`_PARAMETERS`)."""
    return {"now": now, "limit": limit, "owner": owner, "lease": lease_until,
            "node": node_id, **_DEAD}


def _taken(rows: Any) -> list[Any]:
    """The rows the claim statement took (its one row with the flags has no task when
    it took none), in `_claim_order`."""
    return sorted((row for row in rows if row.id is not None), key=_claim_order)


def model_entries(rows: list[Any]) -> dict[str, ModelEntry | None]:
    """The registry entries the claimed rows brought along, by model id (None: the
    model is gone); each is taken from the first row of its model."""
    found: dict[str, ModelEntry | None] = {}
    for row in rows:
        if row.model not in found:
            found[row.model] = None if row.m_id is None else ModelEntry(
                *(getattr(row, f"m_{field}") for field in ModelEntry._fields))
    return found


def _claim_order(row: Any) -> tuple[Any, ...]:
    """Resumable tasks first, oldest first; then the fair line's order."""
    if row.status == Status.RUNNING:
        return (0, row.run_at, 0, row.id)
    return (1, row.priority, row.vtime, row.id)


# Written out rather than built with SQLAlchemy: the built statement came to 4,600
# characters and 40 parameters, past the sizes psycopg caches the parsing of, and
# building its parameters cost more CPU than any other step of a claim. The partial
# index predicates are the literal terms of `core.tables` (IS_LEASED, IS_IN_LINE,
# IS_OUTSIDE_LINE). The two UPDATEs find the candidates by primary key and nothing
# else: the candidates' `FOR UPDATE` locks, taken by this statement with their states
# rechecked on the newest row versions, already hold those states until the commit.
# A state term there (`status IN ('running', 'queued')`, as `transitions.move` fences)
# added nothing but let the planner, with statistics older than the backlog, scan
# every live task through `ix_tasks_active_status` twice per claim instead. Each
# UPDATE looks up only the candidates it may move (`fresh`: attempts left, read from
# the locked rows), and the output reset only those of a task that ever started (an
# attempt writes output only once claimed, and `started_at` is never cleared; a first
# attempt's response is as it was born): a claim of new tasks then reads no task
# twice and no response.
_TEMPLATE = """
WITH /*waiting*/resumable AS (
  SELECT tasks.id, tasks.attempts < tasks.max_attempts AS fresh, tasks.started_at
  FROM tasks JOIN responses ON responses.task_id = tasks.id
  WHERE status IN ('loading', 'running', 'cancelling') AND tasks.status = 'running'
    AND tasks.on_restart = 'resume'
    AND (tasks.lease_expires_at IS NULL OR tasks.lease_expires_at <= :now)
    AND tasks.model NOT IN (SELECT id FROM models WHERE max_concurrency IS NOT NULL)/*gate*/
  ORDER BY tasks.run_at, tasks.id
  LIMIT :limit FOR UPDATE OF tasks SKIP LOCKED),
queued AS (
  SELECT tasks.id, tasks.attempts < tasks.max_attempts AS fresh, tasks.started_at FROM tasks
  WHERE status = 'queued' AND vtime IS NOT NULL AND tasks.run_at <= :now
    AND tasks.model NOT IN (SELECT id FROM models WHERE max_concurrency IS NOT NULL)/*gate*/
  ORDER BY tasks.priority, tasks.vtime, tasks.id
  LIMIT :limit - (SELECT count(*) FROM resumable) FOR UPDATE OF tasks SKIP LOCKED),
candidates AS (SELECT * FROM resumable UNION ALL SELECT * FROM queued),
claimed AS (
  UPDATE tasks SET
    status = CASE WHEN status = 'running' THEN 'running' ELSE 'loading' END,
    owner_token = :owner, lease_expires_at = :lease, node_id = :node,
    attempts = attempts + 1, started_at = coalesce(started_at, :now),
    error_code = NULL, error_message = NULL,
    snapshot = CASE WHEN status = 'running' THEN snapshot END,
    updated_at = :now, last_seq = last_seq + 1
  WHERE id = ANY(ARRAY(SELECT id FROM candidates WHERE fresh)) AND attempts < max_attempts
  RETURNING id, status, attempts, last_seq, model, request AS request_json,
    snapshot AS snapshot_json, run_at, priority, vtime,
    (SELECT count(*) FROM task_events AS e
     WHERE e.task_id = tasks.id AND e.type = 'response.output_item.added') AS items_opened,
    CASE WHEN status = 'running' THEN (SELECT r.output_text FROM responses AS r
                                       WHERE r.task_id = tasks.id) ELSE '' END AS output_text,
    CASE WHEN status = 'running' THEN (SELECT r.input_tokens FROM responses AS r
                                       WHERE r.task_id = tasks.id) ELSE 0 END AS input_tokens,
    CASE WHEN status = 'running' THEN (SELECT r.output_tokens FROM responses AS r
                                       WHERE r.task_id = tasks.id) ELSE 0 END AS output_tokens),
dead AS (
  UPDATE tasks SET status = 'failed', finished_at = :now, owner_token = NULL,
    lease_expires_at = NULL, error_code = :dead_code, error_message = :dead_message,
    dead_lettered = 1, updated_at = :now, last_seq = last_seq + 1
  WHERE id = ANY(ARRAY(SELECT id FROM candidates WHERE NOT fresh))
    AND attempts >= max_attempts
  RETURNING id, last_seq),
logged AS (
  INSERT INTO task_events (task_id, seq, type, created_at, data)
  SELECT id, last_seq,
    CASE WHEN status = 'running' THEN 'response.in_progress' ELSE 'response.loading' END,
    :now, '{"attempt":' || attempts || '}'
  FROM claimed
  UNION ALL SELECT id, last_seq, 'response.failed', :now, :dead_data FROM dead),
reset AS (
  UPDATE responses SET output_text = '', input_tokens = 0, output_tokens = 0, updated_at = :now
  WHERE task_id = ANY(ARRAY(SELECT id FROM claimed WHERE status = 'loading'
                            AND id IN (SELECT id FROM candidates WHERE started_at IS NOT NULL)))
    AND (output_text <> '' OR input_tokens <> 0 OR output_tokens <> 0))
SELECT flag.upstream_models, flag.waiting, claimed.*, /*entry*/
FROM (SELECT EXISTS (SELECT FROM models WHERE max_concurrency IS NOT NULL) AS upstream_models,
             /*waits*/ AS waiting) AS flag
LEFT JOIN claimed ON true
LEFT JOIN models ON models.id = claimed.model
"""
# Each claimed task's registry entry rides along (`m_<field>`, NULL when the model is
# gone): the model check at the task's start needs no transaction of its own.
_ENTRY = ", ".join(f"models.{column.name} AS m_{column.key}" for column in ENTRY_COLUMNS)
# `core.store.line._due_now`'s question, asked first: does a waiting task's time
# come before the line is read? (`ix_tasks_outside_line`)
_WAITING = """waiting AS (
  SELECT tasks.id FROM tasks WHERE status = 'queued' AND vtime IS NULL AND tasks.run_at <= :now
  ORDER BY tasks.run_at, tasks.id LIMIT 1 FOR UPDATE SKIP LOCKED),
"""


def _variant(gated: bool) -> Any:
    """The statement that claims only when no waiting task is due (`gated`: its
    answer says so), or the one that claims whatever is in line."""
    sql = (_TEMPLATE.replace("/*waiting*/", _WAITING if gated else "").replace("/*entry*/", _ENTRY)
           .replace("/*gate*/", "\n    AND NOT EXISTS (SELECT FROM waiting)" if gated else "")
           .replace("/*waits*/", "EXISTS (SELECT FROM waiting)" if gated else "false"))
    # Sent without its indentation: psycopg caches the parsing of a statement only up
    # to 4,096 characters (`MAX_CACHED_STATEMENT_LENGTH`), and parsing this one again
    # on every claim costs more than its indentation is worth.
    sql = "\n".join(line.strip() for line in sql.strip().splitlines())
    return text(sql).bindparams(
        bindparam("now", type_=BigInteger), bindparam("limit", type_=Integer),
        bindparam("lease", type_=BigInteger), bindparam("owner", type_=String),
        bindparam("node", type_=String), bindparam("dead_code", type_=String),
        bindparam("dead_message", type_=String), bindparam("dead_data", type_=Text))


_CLAIM = {gated: _variant(gated) for gated in (True, False)}


_PARAMETERS = ("now", "limit", "owner", "lease", "node", "dead_code", "dead_message", "dead_data")


@cache
def _driver_statement(dialect: Dialect) -> tuple[str, dict[str, Any]]:
    """The gated claim as the driver runs it (`claim_alone`)."""
    return driver_text(_CLAIM[True], dialect, {name: None for name in _PARAMETERS})


_DEAD = {"dead_code": DEAD_LETTER_ERROR["code"], "dead_message": DEAD_LETTER_ERROR["message"],
         "dead_data": encoded({"error": DEAD_LETTER_ERROR, "dead_lettered": True})}
