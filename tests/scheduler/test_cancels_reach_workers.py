"""A cancel reaches the worker at once, even while its engine has nothing to write.

Left alone, the worker would learn of a cancel at its next write (a flush) or its next
heartbeat; an engine that is loading, or reading a long prompt, writes nothing for
seconds. The engine here sleeps 3 s before its first word, and the heartbeat period is
far longer than the time allowed, so only the lease keeper asking the store at each
tick can be what stops it, wherever the cancel was made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import text

from core.settings import Settings
from core.states import Status
from core.store.connect import open_database
from core.store.database import Database
from core.store.tasks import cancel
from scheduler.loop import SweeperLoop
from scheduler.workers import Workers
from tests.scheduler.processes import wait_until
from tests.store.helpers import assert_log_sound, event_types, new_task, task_row

SILENT = "words=2 delay=3"  # 3 s before the first chunk: no flush to notice a cancel by


@pytest.fixture
def slow_heartbeat(fast: Settings) -> Settings:
    return replace(fast, heartbeat_seconds=30, lease_seconds=60)


@pytest.fixture
def other_process_db(fast: Settings) -> Iterator[Database]:
    """The store as another process sees it: no in-process listener is shared."""
    other = open_database(fast)
    yield other
    other.dispose()


def cancel_once_running(db: Database, task_id: str) -> float:
    """Seconds from the cancel of a running task (through `db`) to `cancelled`."""
    wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=5,
               what="running")
    started = time.monotonic()
    assert cancel(db, task_id, None).status_code == 202
    wait_until(lambda: task_row(db, task_id).status == Status.CANCELLED, timeout=40,
               what="cancelled")
    return time.monotonic() - started


def test_a_cancel_made_in_the_workers_process_stops_a_silent_engine_at_once(
    db: Database, slow_heartbeat: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input=SILENT)
    workers = Workers(db, slow_heartbeat)
    workers.claim()
    try:
        elapsed = cancel_once_running(db, task_id)
    finally:
        workers.stop(drain_seconds=0)
    assert elapsed < 2.0  # the keeper's next tick and two transactions (~0.2 s), not 30 s
    assert event_types(db, task_id)[-2:] == ["response.cancelling", "response.cancelled"]
    assert_log_sound(db, task_id)


def test_a_cancel_from_another_process_stops_a_silent_engine_at_once_on_either_store(
    db: Database, slow_heartbeat: Settings, other_process_db: Database, model_id: str
) -> None:
    # The sweeper's lease keeper asks the store at each tick: far sooner than the 30 s
    # heartbeat, with no push between the processes.
    task_id = new_task(db, model_id, input=SILENT)
    loop = SweeperLoop(db, slow_heartbeat, in_process_wakeups=False)
    loop.start()
    try:
        elapsed = cancel_once_running(other_process_db, task_id)
    finally:
        loop.stop()
    assert elapsed < 2.0
    assert event_types(db, task_id)[-1] == "response.cancelled"
    assert_log_sound(db, task_id)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no LISTEN
def test_a_cancel_is_seen_at_once_while_the_listen_connection_is_down(
    db: Database, slow_heartbeat: Settings, other_process_db: Database, model_id: str
) -> None:
    # 20 s before the first word and a 30 s heartbeat: neither a flush nor a renewal
    # comes before the bound. Cancels do not travel by LISTEN, so losing it is harmless.
    task_id = new_task(db, model_id, input="words=1 delay=20")
    loop = SweeperLoop(db, slow_heartbeat, in_process_wakeups=False)
    loop.start()
    try:
        wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=5,
                   what="running")
        with other_process_db.write() as conn:  # the listener's backend goes away
            dropped = conn.execute(text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%'")).scalar()
        assert dropped == 1
        started = time.monotonic()
        assert cancel(other_process_db, task_id, None).status_code == 202  # heard by nobody
        wait_until(lambda: task_row(db, task_id).status == Status.CANCELLED, timeout=40,
                   what="cancelled")
        elapsed = time.monotonic() - started
    finally:
        loop.stop()
    assert elapsed < 5.0  # a keeper tick or two, not the 20 s or 30 s
    assert_log_sound(db, task_id)
