"""The sweeper's recurring queries reach `tasks` through an index, never a full scan.

They run every few milliseconds (claims) or every pass (leases, cancels, retention),
while `tasks` holds the whole finished history. Each statement is captured as the
store really runs it (same SQL, same parameters) and handed to the database's own
EXPLAIN: a plan that reads all of `tasks` fails the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from sqlalchemy import event

from core.states import ACTIVE, LEASED, TERMINAL, Status
from core.store import claims, driver, pg_claims, tasks
from core.store.database import Database
from core.store.finished_per_minute import finished_per_minute
from core.store.queue_stats import queue_stats
from core.store.recovery import expire_leases, finalise_orphaned_cancels
from core.store.retention import remove_expired
from core.store.tasks import cancelling_among
from core.tables import IS_ACTIVE, IS_LEASED, IS_QUEUED, IS_TERMINAL, status_sql
from core.tables import tasks as tasks_table
from tests.store.helpers import fill_line, force, new_task

Statement = tuple[str, Any]


@contextmanager
def captured(db: Database) -> Iterator[list[Statement]]:
    """Every single-row-parameter statement on `tasks` run meanwhile, through
    SQLAlchemy or on an autocommit driver cursor (`core.store.pg_claims.claim_alone`,
    the lease keeper's `core.store.tasks.cancelling_among`)."""
    seen: list[Statement] = []

    def record(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        reads_tasks = " tasks" in sql and ("FROM tasks" in sql or sql.startswith("UPDATE tasks"))
        if reads_tasks and not many:
            seen.append((sql, params))

    class Recorded:
        def __init__(self, cursor: Any) -> None:
            self._cursor = cursor

        def __getattr__(self, name: str) -> Any:
            return getattr(self._cursor, name)

        def __setattr__(self, name: str, value: Any) -> None:
            if name == "_cursor":
                object.__setattr__(self, name, value)
            else:
                setattr(self._cursor, name, value)

        def execute(self, sql: str, params: Any) -> Any:
            record(None, None, sql, params, None, False)
            return self._cursor.execute(sql, params)

    @contextmanager
    def recording(engine: Any) -> Iterator[Any]:
        with driver.autocommit_cursor(engine) as cursor:
            yield Recorded(cursor)

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        with (mock.patch.object(pg_claims, "autocommit_cursor", recording),
              mock.patch.object(tasks, "autocommit_cursor", recording)):
            yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def full_scans(db: Database, statement: Statement) -> list[str]:
    """The plan lines that read every row of `tasks`."""
    sql, params = statement
    with db.engine.connect() as conn:
        if db.is_sqlite:
            plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)]
            return [line for line in plan if line == "SCAN tasks"]
        # A tiny table is cheapest to scan: forbid that (for this transaction only), so
        # only an unusable index shows.
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = [row[0] for row in conn.exec_driver_sql(f"EXPLAIN {sql}", params)]
        conn.rollback()
        return [line for line in plan if "Seq Scan on tasks" in line]


def cancel_check(db: Database) -> set[str]:
    """The lease keeper's question, asked every tick while it holds tasks."""
    return cancelling_among(db, ["resp_a", "resp_b"])


SWEEPER_STEPS: dict[str, Callable[[Database], object]] = {
    "cancel_check": cancel_check,
    "claim": lambda db: claims.claim(db, limit=4, lease_ms=60_000, node_id="n"),
    "expire_leases": expire_leases,
    "finalise_orphaned_cancels": finalise_orphaned_cancels,
    "retention": lambda db: remove_expired(db, retention_ms=0, batch_size=100),
}


@pytest.mark.parametrize("step", sorted(SWEEPER_STEPS))
def test_a_sweeper_step_never_scans_the_tasks_table(db: Database, model_id: str,
                                                    step: str) -> None:
    for _ in range(3):
        new_task(db, model_id)
    with captured(db) as statements:
        SWEEPER_STEPS[step](db)
    assert statements, "the step ran no statement on tasks"
    for statement in statements:
        assert full_scans(db, statement) == [], statement[0]


# `status` compared with a bound parameter: `?` (sqlite3), `%(name)s` or `%s` (psycopg).
_BOUND_STATUS = re.compile(r"\bstatus\s*(?:=|!=|<>|(?:NOT\s+)?IN\s*\()\s*(?:\?|%)", re.IGNORECASE)


# The recurring reads that name a task state: the sweeper's (its lease expiry and
# orphaned-cancel steps only update), and the console's polls.
STATE_READS: dict[str, Callable[[Database], object]] = {
    **{step: SWEEPER_STEPS[step] for step in ("cancel_check", "claim", "retention")},
    "list_by_state": lambda db: tasks.list_tasks(db, None, status=Status.QUEUED),
    "finished_per_minute": lambda db: finished_per_minute(db, db.clock.now_ms()),
}


@pytest.mark.parametrize("read", sorted(STATE_READS))
def test_a_recurring_read_states_the_task_state_in_its_text_not_as_a_parameter(
    db: Database, model_id: str, read: str
) -> None:
    # SQLite plans a query whose `status` is compared with a parameter by the value bound
    # then (the partial indexes on `status` may apply), and prepares it again each time
    # the parameter is bound, that is at every execution: ~40 us a read (core.tables).
    for _ in range(3):
        new_task(db, model_id)
    with captured(db) as statements:
        STATE_READS[read](db)
    reads = [sql for sql, _ in statements if sql.lstrip().upper().startswith(("SELECT", "WITH"))]
    assert reads, "the read ran no SELECT on tasks"
    assert [sql for sql in reads if _BOUND_STATUS.search(sql)] == []


def test_the_index_predicates_name_exactly_the_state_sets_of_the_state_machine() -> None:
    # The predicates are literal SQL (they must match the migrated indexes term for
    # term); this keeps them from drifting away from `core.states`.
    def named(clause: Any) -> set[str]:
        return set(re.findall(r"'([a-z_]+)'", clause.text))

    assert named(IS_QUEUED) == {Status.QUEUED.value}
    assert named(IS_ACTIVE) == {s.value for s in ACTIVE}
    assert named(IS_LEASED) == {s.value for s in LEASED}
    assert named(IS_TERMINAL) == {s.value for s in TERMINAL}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_one_state_term_reaches_the_partial_index_of_that_state(db: Database) -> None:
    # SQLite matches a partial index's predicate term by term: `status IN ('queued')`
    # scans the table where `status = 'queued'` uses `ix_tasks_due`.
    columns = tasks_table.c
    sql = (f"SELECT {columns.id.name} FROM {tasks_table.name} "
           f"WHERE {status_sql(Status.QUEUED)} ORDER BY {columns.run_at.name}, {columns.id.name}")
    with db.engine.connect() as conn:
        plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
    assert any("ix_tasks_due" in step for step in plan), plan


def test_the_metrics_read_never_scans_the_tasks_table(db: Database, model_id: str) -> None:
    for _ in range(3):
        new_task(db, model_id)
    with captured(db) as statements:
        queue_stats(db, db.clock.now_ms())
    # By state, due queued, due handed back, expired leases, unheld cancels, dead letters.
    assert len(statements) == 6
    for statement in statements:
        assert full_scans(db, statement) == [], statement[0]


def test_the_consoles_per_minute_throughput_never_scans_the_tasks_table(
    db: Database, model_id: str,
) -> None:
    for _ in range(3):
        new_task(db, model_id)
    with captured(db) as statements:
        finished_per_minute(db, db.clock.now_ms())
    assert len(statements) == 1
    assert full_scans(db, statements[0]) == [], statements[0][0]


def test_live_tasks_are_counted_by_state_from_one_index(db: Database, model_id: str) -> None:
    for _ in range(3):
        new_task(db, model_id)
    with captured(db) as statements:
        queue_stats(db, db.clock.now_ms())
    [by_status] = [s for s in statements if "GROUP BY" in s[0]]
    with db.engine.connect() as conn:
        if db.is_sqlite:
            plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {by_status[0]}",
                                                           by_status[1])]
            assert any("COVERING INDEX ix_tasks_active_status" in line for line in plan), plan
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            plan = [row[0] for row in conn.exec_driver_sql(f"EXPLAIN {by_status[0]}",
                                                           by_status[1])]
            # On a near-empty table PostgreSQL may read the same live rows through the
            # other index over exactly the active tasks (the per-client quota count's).
            assert any("ix_tasks_active_status" in line or "ix_tasks_client_active" in line
                       for line in plan), plan


def _line_plan(db: Database, statement: Statement) -> list[str]:
    sql, params = statement
    with db.engine.connect() as conn:
        if db.is_sqlite:
            return [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)]
        plan = [row[0] for row in conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) {sql}", params)]
        conn.rollback()  # EXPLAIN ANALYZE took the row locks: give them back
        return plan


def _line_read(plan: list[str]) -> list[str]:
    """The plan of the line's read: on PostgreSQL the claim is one statement
    (`core.store.pg_claims`) whose `queued` CTE reads the line; its writes come after."""
    start = next((i for i, step in enumerate(plan) if step.strip() == "CTE queued"), None)
    if start is None:
        return plan
    indent = len(plan[start]) - len(plan[start].lstrip())
    end = next((i for i in range(start + 1, len(plan))
                if len(plan[i]) - len(plan[i].lstrip()) <= indent), len(plan))
    return plan[start + 1:end]


def test_the_fair_claim_reads_the_line_in_index_order_with_100000_tasks_of_100_clients(
    db: Database, model_id: str
) -> None:
    fill_line(db, model_id, clients=100, per_client=1000)
    waiting = new_task(db, model_id, client="client-7")
    force(db, waiting, vtime=None)  # due, outside the line: this claim places it
    with captured(db) as statements:
        new_task(db, model_id, client="client-8")  # placed at enqueue
        taken = claims.claim(db, limit=4, lease_ms=60_000, node_id="n")
    assert len({c.task_id for c in taken}) == 4
    # The last statement that reads the line (on PostgreSQL, the claim that found the
    # waiting task due claimed nothing; the one after its placing read the line).
    line = [s for s in statements if "ORDER BY tasks.priority, tasks.vtime" in s[0]][-1]
    plan = _line_read(_line_plan(db, line))
    assert any("ix_tasks_line" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step or step.lstrip(" ->").startswith("Sort")
                   for step in plan), plan  # no sort of the queue: the index is the order
    if not db.is_sqlite:  # the pages the whole statement touched (its top node's count)
        top = next(step for step in plan if "Buffers:" in step)
        touched = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
        assert touched < 50, plan
    for statement in statements:
        assert full_scans(db, statement) == [], statement[0]


def test_the_claim_finds_its_candidates_by_primary_key_with_statistics_older_than_the_backlog(
    db: Database, model_id: str
) -> None:
    new_task(db, model_id)
    with db.write() as conn:  # statistics of a table holding one live task
        conn.exec_driver_sql("ANALYZE" if db.is_sqlite else "ANALYZE tasks")
    fill_line(db, model_id, clients=10, per_client=1000, analyze=False)
    with captured(db) as statements:
        taken = claims.claim(db, limit=4, lease_ms=60_000, node_id="n")
    assert len(taken) == 4
    moves = [s for s in statements if "UPDATE tasks" in s[0]]
    assert moves, [s[0] for s in statements]
    for statement in moves:
        plan = _line_plan(db, statement)
        if db.is_sqlite:
            assert not any("ix_tasks_active_status" in step or step == "SCAN tasks"
                           for step in plan), plan
        else:  # each move reads its candidates, not the 10,000 live tasks
            assert not any("ix_tasks_active_status" in step for step in plan), plan
            top = next(step for step in plan if "Buffers:" in step)
            touched = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
            assert touched < 200, plan
