"""Placing waiting tasks into the fair line (`core.store.line.place_due`).

A claim places at most `PLACED_PER_CLAIM` of the waiting tasks now due, round-robin
across clients, and finds them by index however many wait: these tests set the
waiting tasks up directly (due, outside the line) and place them as a claim does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select, text

from core.store.database import Database
from core.store.line import PLACED_PER_CLAIM, place_due
from core.tables import tasks
from tests.store.helpers import fill_line, new_task

Statement = tuple[str, Any]


def _wait(db: Database, run_at: int, *ids: str) -> None:
    """Take tasks out of the line, due at `run_at`, as a requeue leaves them."""
    with db.write() as conn:
        conn.execute(tasks.update().where(tasks.c.id.in_(ids)).values(vtime=None, run_at=run_at))


def _waiting(db: Database, model: str, backlog: dict[str, int]) -> dict[str, list[str]]:
    """`backlog[client]` waiting tasks of each client, all due: each client's ids, oldest
    first. Client k's tasks are due k ms after the first client's."""
    fill_line(db, model, clients=1, per_client=sum(backlog.values()), analyze=False)
    with db.read() as conn:
        ids = iter(row.id for row in conn.execute(select(tasks.c.id).order_by(tasks.c.id)))
    now = db.clock.now_ms()
    owned = {client: [next(ids) for _ in range(count)] for client, count in backlog.items()}
    for offset, (client, owned_ids) in enumerate(owned.items()):
        with db.write() as conn:
            conn.execute(tasks.update().where(tasks.c.id.in_(owned_ids))
                         .values(client_id=client, vtime=None, run_at=now - 1_000 + offset))
    return owned


def _placed(db: Database) -> set[str]:
    with db.read() as conn:
        return {row.id for row in conn.execute(select(tasks.c.id).where(
            tasks.c.vtime.is_not(None)))}


def _place(db: Database, limit: int = PLACED_PER_CLAIM) -> int:
    with db.write() as conn:
        return place_due(conn, db.clock.now_ms(), limit)


def test_one_client_alone_gets_every_place_of_a_placing(db: Database, model_id: str) -> None:
    _waiting(db, model_id, {"client-a": PLACED_PER_CLAIM + 36})
    assert _place(db) == PLACED_PER_CLAIM


def test_each_waiting_client_gets_a_place_before_any_gets_a_second(
    db: Database, model_id: str
) -> None:
    owned = _waiting(db, model_id, {"client-a": 100, "client-b": 1, "client-c": 2})
    assert _place(db, limit=4) == 4
    assert _placed(db) == {*owned["client-a"][:2], *owned["client-b"], owned["client-c"][0]}


def test_with_more_clients_than_places_they_start_at_the_client_that_waited_longest(
    db: Database, model_id: str
) -> None:
    owned = _waiting(db, model_id, {f"client-{n}": 2 for n in range(6)})
    _wait(db, db.clock.now_ms() - 5_000, owned["client-4"][0])
    assert _place(db, limit=3) == 3
    # client-4's task waited longest: from it onwards and round, one task each
    assert _placed(db) == {owned["client-4"][0], owned["client-5"][0], owned["client-0"][0]}


def test_a_task_not_due_yet_is_not_placed(db: Database, model_id: str) -> None:
    owned = _waiting(db, model_id, {"client-a": 2, "client-b": 1})
    _wait(db, db.clock.now_ms() + 60_000, *owned["client-b"], owned["client-a"][1])
    assert _place(db) == 1
    assert _placed(db) == {owned["client-a"][0]}


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_claimers_placing_at_once_place_each_waiting_task_once(
    db: Database, model_id: str
) -> None:
    _waiting(db, model_id, {"client-a": 100, "client-b": 3})
    now = db.clock.now_ms()
    with db.engine.connect() as first, db.engine.connect() as second:
        first.begin()
        second.begin()
        second.exec_driver_sql("SET LOCAL lock_timeout = '2s'")  # a wait fails, not hangs
        placed = place_due(first, now)
        placed += place_due(second, now)  # the first's rows are still locked
        first.commit()
        second.commit()
    assert placed == len(_placed(db)) >= PLACED_PER_CLAIM


@contextmanager
def _placings(db: Database) -> Iterator[list[Statement]]:
    """The statements that pick the waiting tasks to place, as they are run."""
    seen: list[Statement] = []

    def record(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        if sql.lstrip().startswith("WITH RECURSIVE owners"):
            seen.append((sql, params))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def _backlog(db: Database, model: str, *, clients: int, analyze: bool) -> None:
    """100,000 waiting tasks, all due, of `clients` clients."""
    fill_line(db, model, clients=clients, per_client=100_000 // clients, analyze=False)
    with db.write() as conn:
        conn.execute(tasks.update().values(vtime=None, run_at=tasks.c.run_at - 1_000))
        if analyze:
            conn.execute(text("ANALYZE" if db.is_sqlite else "ANALYZE tasks"))


# What a placing may read of `tasks` on SQLite: the earliest due waiting task, the next
# client with waiting tasks, a client's next due ones, rows by primary key.
_SQLITE_READS = re.compile(
    r"SEARCH tasks USING INDEX (ix_tasks_outside_line \(run_at<\?\)"
    r"|ix_tasks_client_outside_line \(client_id[>=]\?.*\)|sqlite_autoindex_tasks_1 \(id=\?\))")


def _pages(plan: list[str]) -> int:
    """The pages a PostgreSQL plan touched (its top node's buffers)."""
    top = next(step for step in plan if "Buffers:" in step)
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))


@pytest.mark.parametrize("clients", [1, 100])
def test_a_placing_among_100000_waiting_tasks_reads_only_what_it_places(
    db: Database, model_id: str, clients: int
) -> None:
    _backlog(db, model_id, clients=clients, analyze=True)
    with _placings(db) as statements:
        assert _place(db) == PLACED_PER_CLAIM
    [(sql, params)] = statements
    with db.engine.connect() as conn:
        if db.is_sqlite:
            plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)]
            reads = [step for step in plan if re.match(r"(SCAN|SEARCH) tasks\b", step)]
            assert reads and all(_SQLITE_READS.fullmatch(step) for step in reads), plan
            return
        plan = [row[0] for row in conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)]
        conn.rollback()  # EXPLAIN ANALYZE took the row locks: give them back
    assert not any("Seq Scan" in step for step in plan), plan
    assert _pages(plan) < 2_000, plan  # ~16 a task placed; reading the backlog: 100,000+


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_placing_with_statistics_older_than_the_backlog_reads_few_pages_and_compiles_nothing(
    db: Database, model_id: str
) -> None:
    _wait(db, db.clock.now_ms() - 1_000, new_task(db, model_id))
    with db.write() as conn:  # statistics of a table holding one waiting task
        conn.execute(text("ANALYZE tasks"))
    _backlog(db, model_id, clients=100, analyze=False)
    with _placings(db) as statements, db.engine.connect() as conn:
        conn.begin()
        assert place_due(conn, db.clock.now_ms()) == PLACED_PER_CLAIM
        [(sql, params)] = statements
        # in the placing's own transaction: its settings, the next 64 tasks
        plan = [row[0] for row in conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)]
        conn.rollback()
    assert not any("Seq Scan" in step or step.startswith("JIT:") for step in plan), plan
    assert _pages(plan) < 2_000, plan
