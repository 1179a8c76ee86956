"""A row another transaction holds (an operator's `SELECT ... FOR UPDATE`) stalls only
its own task's stream: a sweeper's connections bound their lock waits, a shared flush
that meets the held row is written task by task, the held task's output waits and is
written once the hold ends, and every other stream and lease goes on meanwhile.

PostgreSQL alone: a row lock is PostgreSQL's. On SQLite a writer holds the whole file,
and its wait is bounded by TASKWARD_SQLITE_BUSY_TIMEOUT_MS, which this leaves alone."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from core.clock import Clock
from core.settings import Settings
from core.store.connect import create_db_engine, sweeper_lock_wait_ms
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.store.outage import is_row_held, outage_behind, outage_cause
from scheduler import stream_thread
from tests.databases import truncate_all
from tests.engines import expected_text
from tests.scheduler.helpers import run_pass, streamed_text
from tests.store.helpers import assert_log_sound, new_task, task_row

WORDS = 80
HOLD_SECONDS = 3.0


@pytest.fixture
def database_url(pg_url: str) -> Iterator[str]:
    """The session's PostgreSQL database, emptied (no SQLite: see the module's doc)."""
    truncate_all(pg_url)
    yield pg_url


@pytest.fixture
def sweeping(fast: Settings) -> Settings:
    """Flushes by time every 100 ms; a lease long enough to outlive the hold."""
    return replace(fast, flush_interval_ms=100, flush_bytes=10_000, lease_seconds=8,
                   heartbeat_seconds=1)


@pytest.fixture
def sweeper_db(sweeping: Settings) -> Iterator[Database]:
    """The store as a sweeper process opens it (its connections' session bounds)."""
    database = Database(create_db_engine(sweeping, "sweeper"), Clock())
    yield database
    database.dispose()


def _lock_timeout(db: Database) -> str:
    with db.read() as conn:
        return str(conn.execute(text("SHOW lock_timeout")).scalar_one())


def test_a_sweepers_connections_bound_their_lock_waits_and_an_api_process_does_not(
        sweeping: Settings, sweeper_db: Database) -> None:
    assert sweeper_lock_wait_ms(sweeping) == 250
    assert _lock_timeout(sweeper_db) == "250ms"
    api = Database(create_db_engine(sweeping, "api"), Clock())
    named = Database(create_db_engine(
        replace(sweeping, database_url=sweeping.database_url + "?options=-c+lock_timeout%3D0"),
        "sweeper"), Clock())
    try:
        assert _lock_timeout(api) == "0"
        assert _lock_timeout(named) == "0"  # the operator's own setting is kept
    finally:
        api.dispose()
        named.dispose()


def _held_for(db: Database, table: str, task_id: str, seconds: float,
              during: dict[str, Any], watched: list[str]) -> None:
    """Hold `task_id`'s row of `table` for `seconds` from another session; record in
    `during` each watched task's streamed length and lease at the hold's start and
    end."""
    column = "task_id" if table == "responses" else "id"
    with psycopg.connect(libpq_conninfo(db.engine)) as operator:
        operator.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (task_id,))
        during["start"] = _seen(db, watched)
        time.sleep(seconds)
        during["end"] = _seen(db, watched)
        operator.rollback()


def _seen(db: Database, task_ids: list[str]) -> dict[str, tuple[int, int]]:
    return {t: (len(streamed_text(db, t)), task_row(db, t).lease_expires_at) for t in task_ids}


@pytest.mark.parametrize("table", ["responses", "tasks"])
def test_a_held_row_stalls_only_its_own_stream_which_resumes_when_the_hold_ends(
        sweeper_db: Database, sweeping: Settings, model_id: str, table: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=stream_thread.log.name)
    ids = [new_task(sweeper_db, model_id, input=f"words={WORDS} delay=0.05")
           for _ in range(4)]
    held, others = ids[0], ids[1:]
    outcomes: dict[str, Any] = {}
    sweeper = threading.Thread(target=lambda: outcomes.update(run_pass(sweeper_db, sweeping)))
    sweeper.start()
    deadline = time.monotonic() + 20
    while not streamed_text(sweeper_db, held) and time.monotonic() < deadline:
        time.sleep(0.02)
    during: dict[str, Any] = {}
    _held_for(sweeper_db, table, held, HOLD_SECONDS, during, ids)
    sweeper.join(60)

    start, end = during["start"], during["end"]
    for task_id in others:  # streamed on and renewed while the row was held
        assert end[task_id][0] > start[task_id][0] + 20, (start, end)
        assert end[task_id][1] > start[task_id][1], (start, end)
    assert end[held][0] == start[held][0], (start, end)  # nothing of it lands while held
    assert outcomes["completed"] == 4, outcomes
    for task_id in ids:
        assert streamed_text(sweeper_db, task_id) == expected_text(WORDS)
        assert_log_sound(sweeper_db, task_id)
    said = [r.getMessage() for r in caplog.records if r.name == stream_thread.log.name]
    assert [line for line in said if "held by another transaction (" in line] == [
        f"task {held}: a row of it is held by another transaction (SQLSTATE 55P03 (lock "
        f"not available, held by another transaction)); its output waits, tried again "
        f"every {stream_thread.HELD_RETRY_MS} ms"]
    assert f"task {held}: the row held by another transaction is free; its output is " \
           "written" in said
    assert not any("w1 " in line for line in said)  # no output in the lines


def test_a_held_row_is_no_store_outage_for_a_worker(sweeper_db: Database, model_id: str
                                                     ) -> None:
    task_id = new_task(sweeper_db, model_id)
    with psycopg.connect(libpq_conninfo(sweeper_db.engine)) as operator:
        operator.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
        with pytest.raises(Exception) as raised, sweeper_db.write() as conn:
            conn.execute(text("SET LOCAL lock_timeout = 100"))  # whatever the session's
            conn.execute(text("UPDATE tasks SET updated_at = 1 WHERE id = :id"),
                         {"id": task_id})
        operator.rollback()
    assert is_row_held(raised.value)
    assert outage_behind(raised.value) is None
    assert outage_cause(getattr(raised.value, "orig")) == (
        "SQLSTATE 55P03 (lock not available, held by another transaction)")


def test_a_held_task_whose_lease_runs_out_during_the_hold_ends_lost_and_the_others_complete(
        sweeper_db: Database, sweeping: Settings, model_id: str) -> None:
    """Its `tasks` row held, the task's lease cannot be renewed: once it runs out, the
    attempt gives its refused flush up and ends `lost` (its restart policy applies
    after the hold), while the other streams complete whole."""
    settings = replace(sweeping, lease_seconds=3)
    ids = [new_task(sweeper_db, model_id, input=f"words={WORDS} delay=0.05")
           for _ in range(3)]
    held = ids[0]
    outcomes: dict[str, Any] = {}
    sweeper = threading.Thread(target=lambda: outcomes.update(run_pass(sweeper_db, settings)))
    sweeper.start()
    deadline = time.monotonic() + 20
    while not streamed_text(sweeper_db, held) and time.monotonic() < deadline:
        time.sleep(0.02)
    _held_for(sweeper_db, "tasks", held, 5.0, {}, ids)
    sweeper.join(60)

    assert outcomes["lost"] == 1 and outcomes["completed"] == 2, outcomes
    assert len(streamed_text(sweeper_db, held)) < len(expected_text(WORDS))
    assert_log_sound(sweeper_db, held)
    for task_id in ids[1:]:
        assert streamed_text(sweeper_db, task_id) == expected_text(WORDS)
        assert_log_sound(sweeper_db, task_id)
