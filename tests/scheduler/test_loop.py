"""The long-running loop: cron-timed maintenance, wake-ups, and its graceful stop."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from freezegun import freeze_time
from sqlalchemy import select

from core.clock import Clock
from core.cron import next_slot, parse_cron
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.tables import tasks
from scheduler.loop import SweeperLoop
from scheduler.timer import MaintenanceTimer
from scheduler.workers import Workers
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import event_types, events_of, new_task, task_row


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def next_pass_ms(schedule: str, after_ms: int) -> int:
    return next_slot(parse_cron(schedule), after_ms)  # what the timer asks


def test_the_next_pass_is_the_first_cron_slot_strictly_after_now() -> None:
    assert next_pass_ms("* * * * *", ms("2026-03-01 12:00:30")) == ms("2026-03-01 12:01:00")
    assert next_pass_ms("* * * * *", ms("2026-03-01 12:01:00")) == ms("2026-03-01 12:02:00")
    assert next_pass_ms("*/15 * * * *", ms("2026-03-01 12:01:00")) == ms("2026-03-01 12:15:00")
    assert next_pass_ms("0 3 * * *", ms("2026-03-01 12:01:00")) == ms("2026-03-02 03:00:00")


def test_maintenance_runs_at_start_and_then_once_per_cron_slot() -> None:
    passes: list[str] = []
    with freeze_time("2026-03-01 12:00:30") as frozen:
        timer = MaintenanceTimer("* * * * *", Clock(),
                                 lambda: passes.append(datetime.now(UTC).strftime("%M:%S")))
        polls = []
        for step in (0, 20, 10, 59, 1, 0):
            frozen.tick(step)
            polls.append(timer.poll())
    assert polls == [True, False, True, False, True, False]
    assert passes == ["00:30", "01:00", "02:00"]


def test_a_new_task_starts_within_a_fraction_of_a_second_without_polling(
    db: Database, fast: Settings, model_id: str
) -> None:
    # SQLite: the API's in-process wake-up; PostgreSQL: LISTEN/NOTIFY. Polling alone
    # would take a full second here (the poll slows down when a push source exists).
    loop = SweeperLoop(db, fast, in_process_wakeups=db.is_sqlite)
    loop.start()
    try:
        time.sleep(0.5)  # let the start pass and the LISTEN connection settle
        task_id = new_task(db, model_id)
        wait_until(lambda: task_row(db, task_id).status == Status.COMPLETED, timeout=5,
                   what="completion")
        created, loading = [e.created_at for e in events_of(db, task_id)[:2]]
        assert loading - created < 300
    finally:
        loop.stop()


def test_stopping_the_loop_hands_back_unfinished_work_and_ends_every_thread(
    db: Database, fast: Settings, model_id: str
) -> None:
    before = set(threading.enumerate())
    task_id = new_task(db, model_id, input="words=1000 delay=0.01")
    loop = SweeperLoop(db, replace(fast, drain_seconds=0.3))
    loop.start()
    wait_until(lambda: streamed_text(db, task_id), timeout=10, what="some output")

    loop.stop()

    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.QUEUED, 0)
    assert event_types(db, task_id)[-1] == "response.queued"
    leftover = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert leftover == []


def test_work_queued_before_the_start_is_claimed_before_listening_and_maintenance(
    db: Database, fast: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `start` returns once the first claim has: the task is no longer queued by then,
    # and the maintenance pass (and the LISTEN connection) begin only after it.
    task_id = new_task(db, model_id, input="words=1")
    seen_at_maintenance: list[str] = []
    original = SweeperLoop._maintain

    def maintain(loop: SweeperLoop) -> None:
        seen_at_maintenance.append(task_row(db, task_id).status)
        original(loop)

    monkeypatch.setattr(SweeperLoop, "_maintain", maintain)
    loop = SweeperLoop(db, fast)
    loop.start()
    try:
        assert task_row(db, task_id).status != Status.QUEUED
        wait_until(lambda: seen_at_maintenance, timeout=5, what="the start's maintenance pass")
        assert seen_at_maintenance[0] != Status.QUEUED
        wait_until(lambda: task_row(db, task_id).status == Status.COMPLETED, timeout=5,
                   what="completion")
    finally:
        loop.stop()


def test_the_starts_maintenance_pass_waits_until_the_backlog_is_claimed(
    db: Database, fast: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three claims' worth of work queued before the start (4 slots): the start's pass
    # runs once a claim found nothing more to start, so nothing is queued by then.
    task_ids = [new_task(db, model_id, input="words=1") for _ in range(12)]
    seen_at_maintenance: list[list[str]] = []
    original = SweeperLoop._maintain

    def maintain(loop: SweeperLoop) -> None:
        with db.read() as conn:  # one read: the claimer goes on meanwhile
            seen_at_maintenance.append(list(conn.execute(select(tasks.c.status)).scalars()))
        original(loop)

    monkeypatch.setattr(SweeperLoop, "_maintain", maintain)
    loop = SweeperLoop(db, fast)
    loop.start()
    try:
        wait_until(lambda: seen_at_maintenance, timeout=5, what="the start's maintenance pass")
        assert Status.QUEUED not in seen_at_maintenance[0]
        wait_until(lambda: all(task_row(db, t).status == Status.COMPLETED for t in task_ids),
                   timeout=10, what="completion")
    finally:
        loop.stop()


def _always_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every claim starts one attempt: a backlog that never ends."""
    def claim(_workers: Workers) -> int:
        time.sleep(0.01)
        return 1

    monkeypatch.setattr(Workers, "gather_slots", lambda _workers: None)
    monkeypatch.setattr(Workers, "claim", claim)


def test_the_starts_maintenance_pass_waits_for_a_backlog_no_longer_than_its_bound(
    db: Database, fast: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _always_busy(monkeypatch)
    monkeypatch.setattr("scheduler.loop._START_PASS_LATEST_SECONDS", 0.3)
    passes: list[float] = []
    monkeypatch.setattr(SweeperLoop, "_maintain",
                        lambda _loop: passes.append(time.monotonic()))
    started = time.monotonic()
    loop = SweeperLoop(db, fast)
    loop.start()
    try:
        wait_until(lambda: passes, timeout=5, what="the start's maintenance pass")
        assert passes[0] - started >= 0.3
    finally:
        loop.stop()


def test_a_loop_stopped_while_its_start_pass_waits_stops_at_once_without_the_pass(
    db: Database, fast: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _always_busy(monkeypatch)
    passes: list[float] = []
    monkeypatch.setattr(SweeperLoop, "_maintain",
                        lambda _loop: passes.append(time.monotonic()))
    loop = SweeperLoop(db, fast)
    loop.start()
    time.sleep(0.2)
    stopping = time.monotonic()
    loop.stop()
    assert time.monotonic() - stopping < 2  # not the bound's 5 s
    assert passes == []
