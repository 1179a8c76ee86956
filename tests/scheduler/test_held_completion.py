"""A completion that meets a row another transaction holds fails alone: the others of
its group complete, and the held one is parked and completes once the hold ends (or
ends `lost` when its lease runs out first), logged as a held row, never as an
abandonment with a traceback.

PostgreSQL alone, as tests/scheduler/test_fhr_held_row.py (a row lock is PostgreSQL's)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from core.clock import Clock
from core.settings import Settings
from core.states import Status
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from scheduler import stream_thread, workers
from tests.databases import truncate_all
from tests.engines import expected_text
from tests.scheduler.helpers import run_pass, streamed_text
from tests.store.helpers import assert_log_sound, new_task, task_row

HOLD_SECONDS = 4.0


@pytest.fixture
def database_url(pg_url: str) -> Iterator[str]:
    truncate_all(pg_url)
    yield pg_url


@pytest.fixture
def sweeper_db(fast: Settings) -> Iterator[Database]:
    settings = replace(fast, lease_seconds=8, heartbeat_seconds=1)
    database = Database(create_db_engine(settings, "sweeper"), Clock())
    yield database
    database.dispose()


def _completed_while_held(db: Database, settings: Settings, ids: list[str], held_id: str
                          ) -> tuple[dict[str, Any], dict[str, str]]:
    """Run a pass over `ids` while another session holds `held_id`'s `responses` row
    for `HOLD_SECONDS`; the pass's outcomes and each task's status at the hold's end."""
    outcomes: dict[str, Any] = {}
    with psycopg.connect(libpq_conninfo(db.engine)) as operator:
        operator.execute("SELECT 1 FROM responses WHERE task_id = %s FOR UPDATE",
                         (held_id,))
        sweeper = threading.Thread(target=lambda: outcomes.update(run_pass(db, settings)))
        sweeper.start()
        time.sleep(HOLD_SECONDS)
        during = {t: task_row(db, t).status for t in ids}
        operator.rollback()
    sweeper.join(60)
    assert not sweeper.is_alive()
    return outcomes, during


def test_a_held_completion_fails_alone_and_completes_once_the_hold_ends(
        sweeper_db: Database, fast: Settings, model_id: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    settings = replace(fast, lease_seconds=8, heartbeat_seconds=1)
    ids = [new_task(sweeper_db, model_id, input="words=3") for _ in range(4)]
    held = ids[0]

    outcomes, during = _completed_while_held(sweeper_db, settings, ids, held)

    assert {t: during[t] for t in ids[1:]} == dict.fromkeys(ids[1:], Status.COMPLETED)
    assert during[held] != Status.COMPLETED
    assert outcomes["completed"] == 4, outcomes
    for task_id in ids:
        assert task_row(sweeper_db, task_id).status == Status.COMPLETED
        assert streamed_text(sweeper_db, task_id) == expected_text(3)
        assert_log_sound(sweeper_db, task_id)
    said = [r.getMessage() for r in caplog.records]
    assert f"task {held}: a row of it is held by another transaction (SQLSTATE 55P03 " \
           f"(lock not available, held by another transaction)); its completion waits, " \
           f"tried again every {stream_thread.HELD_RETRY_MS} ms" in said
    assert f"task {held}: the row held by another transaction is free; its completion " \
           "is written" in said
    assert not any("abandoned" in line for line in said)


def test_a_held_row_given_up_on_is_logged_as_held_without_a_traceback(
        sweeper_db: Database, model_id: str, caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy import text

    task_id = new_task(sweeper_db, model_id)
    with psycopg.connect(libpq_conninfo(sweeper_db.engine)) as operator:
        operator.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
        with pytest.raises(Exception) as raised, sweeper_db.write() as conn:
            conn.execute(text("SET LOCAL lock_timeout = 100"))
            conn.execute(text("UPDATE tasks SET updated_at = 1 WHERE id = :id"),
                         {"id": task_id})
        operator.rollback()
    caplog.set_level(logging.INFO, logger=workers.log.name)
    workers._log_abandoned(task_id, raised.value)

    [record] = [r for r in caplog.records if r.name == workers.log.name]
    assert record.getMessage() == (
        f"task {task_id}: attempt given up, a row of it is held by another transaction "
        "(SQLSTATE 55P03 (lock not available, held by another transaction)); its lease "
        "runs out and its restart policy applies")
    assert record.exc_info is None
