"""What one retention pass covers: every kind of expired row whatever the task backlog,
as much as its time budget allows, and batches sized for the store's locking."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import func, select

import core.store.retention as retention
from core.settings import Settings
from core.store import tasks
from core.store.clients import create_client, create_pairing_code
from core.store.console_sessions import log_in
from core.store.database import Database
from core.store.retention import MIN_BATCH, remove_expired
from core.tables import console_sessions, idempotency_keys, pairing_codes
from core.tables import tasks as tasks_table
from scheduler.retention import clean
from tests.clocks import HandClock
from tests.store.helpers import new_task
from tests.store.test_retention import count, rows_deleted_per_transaction

HOUR = 3600 * 1000


def old_finished_tasks(db: Database, model_id: str, number: int) -> None:
    """`number` cancelled tasks, four rows each (two events, response, row)."""
    for _ in range(number):
        tasks.cancel(db, new_task(db, model_id), None)


def expire_one_of_each(db: Database) -> None:
    """An idempotency key, a pairing code and a console session, all expiring in an hour."""
    with db.write() as conn:
        conn.execute(idempotency_keys.insert().values(
            client_id="c", key="k", request_digest="d", status_code=202, body="{}",
            task_id="resp_x", created_at=db.clock.now_ms(), expires_at=db.clock.now_ms() + HOUR))
    create_pairing_code(db, scopes=frozenset({"responses"}), ttl_seconds=3600)
    admin = create_client(db, name="operator", scopes=frozenset({"admin"}))
    log_in(db, admin.token, ttl_ms=HOUR)


@pytest.mark.parametrize("bound", [{"max_batches": 1}, {"budget_s": 0.0}])
def test_a_pass_cut_short_by_a_task_backlog_still_removes_expired_keys_codes_and_sessions(
    db: Database, model_id: str, bound: dict[str, Any]
) -> None:
    clock = HandClock(1_800_000_000_000)
    db.clock = clock
    old_finished_tasks(db, model_id, 6)
    expire_one_of_each(db)
    clock.ms += 2 * HOUR

    removed = remove_expired(db, retention_ms=HOUR, batch_size=8, **bound)

    assert (removed.tasks, removed.finished) == (2, False)  # the backlog is left
    assert (removed.idempotency_keys, removed.pairing_codes, removed.console_sessions) \
        == (1, 1, 1)
    assert [count(db, table) for table in (idempotency_keys, pairing_codes,
                                           console_sessions)] == [0, 0, 0]


def test_a_maintenance_pass_goes_on_past_fifty_batches_while_its_budget_lasts(
    db: Database, model_id: str, settings: Settings
) -> None:
    clock = HandClock(1_800_000_000_000)
    db.clock = clock
    old_finished_tasks(db, model_id, 120)
    clock.ms += 200 * HOUR  # past the default retention (168 hours)

    # Two tasks a batch: 61 batches, where a pass used to stop at 50.
    summary = clean(db, Settings(**{**settings.__dict__, "retention_batch_size": 8}),
                    threading.Event())

    assert (summary["tasks"], summary["batches"], summary["finished"]) == (120, 61, True)
    assert count(db, tasks_table) == 0


def test_a_graceful_stop_ends_the_pass_after_the_batch_under_way(
    db: Database, model_id: str, settings: Settings
) -> None:
    """The sweeper's stop waits for its maintenance pass before it drains the attempts
    within `TASKWARD_DRAIN_SECONDS`: a pass that went on for its budget (a quarter of
    the interval) would eat into that drain."""
    clock = HandClock(1_800_000_000_000)
    db.clock = clock
    old_finished_tasks(db, model_id, 20)
    clock.ms += 200 * HOUR
    stop = threading.Event()
    stop.set()

    summary = clean(db, Settings(**{**settings.__dict__, "retention_batch_size": 8}), stop)

    assert (summary["batches"], summary["finished"]) == (1, False)
    assert count(db, tasks_table) == 18


def test_slow_batches_shrink_on_sqlite_only_and_the_next_pass_starts_where_the_last_ended(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = HandClock(1_800_000_000_000)
    db.clock = clock
    old_finished_tasks(db, model_id, 80)
    clock.ms += 2 * HOUR
    monkeypatch.setattr(retention, "TARGET_HOLD_S", 1e-9)  # every batch holds too long

    with rows_deleted_per_transaction(db) as first:
        remove_expired(db, retention_ms=HOUR, batch_size=100, max_batches=3)
    with rows_deleted_per_transaction(db) as second:
        remove_expired(db, retention_ms=HOUR, batch_size=100, max_batches=2)

    floor = MIN_BATCH // 4 * 4  # the whole tasks that fit in the smallest batch
    if db.is_sqlite:  # one write lock: halved down to the floor, and it stays there
        assert first == [100, floor, floor]
        assert second == [floor, floor]
    else:  # row locks only: nothing to shrink for
        assert first == [100, 100, 100] and second == [20]
    with db.read() as conn:
        left = conn.execute(select(func.count()).select_from(tasks_table)).scalar_one()
    assert left == 80 - (sum(first) + sum(second)) // 4
