"""Retry backoff: exponential, jittered, bounded — and honoured by the claim."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime

from freezegun import freeze_time

from core.settings import Settings
from core.states import Status
from core.store.database import Database
from scheduler.backoff import retry_delay_ms
from scheduler.claiming import execute_due
from tests.store.helpers import new_task, task_row


def delay(attempt: int, uniform: float) -> int:
    return retry_delay_ms(attempt, base_seconds=2, max_seconds=60, uniform=lambda: uniform)


def test_delay_doubles_with_each_attempt() -> None:
    assert [delay(n, 0.0) for n in (1, 2, 3, 4)] == [1000, 2000, 4000, 8000]


def test_jitter_spreads_the_delay_over_the_upper_half_of_the_step() -> None:
    assert delay(3, 0.0) == 4000
    assert delay(3, 0.5) == 6000
    assert 7990 <= delay(3, 0.999) < 8000


def test_delay_never_exceeds_the_maximum() -> None:
    assert delay(10, 0.999) <= 60_000
    assert delay(10_000, 0.999) <= 60_000
    assert delay(10_000, 0.0) == 30_000


def test_a_retried_task_is_not_claimed_before_its_backoff_has_passed(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, backoff_base_seconds=10, backoff_max_seconds=10)
    with freeze_time(datetime.now(UTC)) as frozen:
        task_id = new_task(db, model_id, input="words=3 fail=retryable fail_at=1",
                           max_attempts=3)
        first = execute_due(db, settings, stop=threading.Event())
        assert first["requeued"] == 1
        run_at = task_row(db, task_id).run_at
        assert 5_000 <= run_at - db.clock.now_ms() <= 10_000

        frozen.tick(4.9)
        assert execute_due(db, settings, stop=threading.Event())["claimed"] == 0
        frozen.tick(5.2)
        assert execute_due(db, settings, stop=threading.Event())["claimed"] == 1
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.QUEUED, 2)


def test_a_retry_after_is_the_floor_of_the_backoff(
    db: Database, fast: Settings, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=3 fail_at=0 fail=retryable retry_after=120")
    before = db.clock.now_ms()
    execute_due(db, fast, stop=threading.Event())  # backoff alone: at most 4 s
    row = task_row(db, task_id)
    assert row.status == Status.QUEUED and row.run_at >= before + 120_000
