"""The lease keeper asks the store about a held task's cancel only while its attempt is
quiet: an attempt that has just written learns of a cancel at its next write, which is
fenced on `running`; once it has not written for `WROTE_RECENTLY_MS`, the keeper asks.

The store's clock is a hand clock here, so "recently" is exactly what the test says,
whatever the machine's speed; the keeper still ticks in real time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from core.settings import Settings
from core.store import claims
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.tasks import cancel
from scheduler.attempt import Attempt, StopReason
from scheduler.heartbeat import WROTE_RECENTLY_MS, LeaseKeeper
from tests.clocks import HandClock
from tests.scheduler.processes import wait_until
from tests.store.helpers import new_task

LEASE_MS = 60_000
TICK_SECONDS = 0.01


@pytest.fixture
def clock() -> HandClock:
    return HandClock(1_700_000_000_000)


@pytest.fixture
def hand_db(settings: Settings, clock: HandClock) -> Iterator[Database]:
    database = Database(create_db_engine(settings), clock)
    yield database
    database.dispose()


@pytest.fixture
def keeper(hand_db: Database) -> Iterator[LeaseKeeper]:
    started = LeaseKeeper(hand_db, lease_ms=LEASE_MS, heartbeat_ms=LEASE_MS,
                          tick_seconds=TICK_SECONDS)
    started.start()
    yield started
    assert started.stop(timeout=5)


def held_attempts(db: Database, keeper: LeaseKeeper, model: str, count: int) -> list[Attempt]:
    for _ in range(count):
        new_task(db, model)
    found = claims.claim(db, limit=count, lease_ms=LEASE_MS, node_id="node-a")
    assert len(found) == count
    attempts = [Attempt(claim, clock=db.clock, timeout_ms=LEASE_MS, lease_ms=LEASE_MS)
                for claim in found]
    for attempt in attempts:
        keeper.hold(attempt)
    return attempts


def test_a_cancel_of_an_attempt_that_just_wrote_waits_for_its_write_or_the_quiet_time(
    hand_db: Database, clock: HandClock, keeper: LeaseKeeper, model_id: str
) -> None:
    writing, quiet = held_attempts(hand_db, keeper, model_id, 2)
    writing.wrote(clock.now_ms())
    for attempt in (writing, quiet):
        assert cancel(hand_db, attempt.task_id, None).status_code == 202

    wait_until(lambda: quiet.stop_reason() is StopReason.CANCEL, timeout=5,
               what="the quiet attempt told of its cancel")
    time.sleep(20 * TICK_SECONDS)  # twenty ticks that must not ask about the writing one
    assert writing.stop_reason() is None

    clock.ms += WROTE_RECENTLY_MS - 1
    time.sleep(20 * TICK_SECONDS)
    assert writing.stop_reason() is None  # its write is still recent

    clock.ms += 1
    wait_until(lambda: writing.stop_reason() is StopReason.CANCEL, timeout=5,
               what="the attempt quiet since its write told of its cancel")


def test_an_attempt_that_never_wrote_is_asked_about_at_once(
    hand_db: Database, keeper: LeaseKeeper, model_id: str
) -> None:
    # Loading, or waiting for an upstream's first token: nothing written yet.
    [attempt] = held_attempts(hand_db, keeper, model_id, 1)
    assert cancel(hand_db, attempt.task_id, None).status_code == 202
    wait_until(lambda: attempt.stop_reason() is StopReason.CANCEL, timeout=5,
               what="the attempt told of its cancel")


def test_a_write_dated_after_now_does_not_hold_off_the_question(
    hand_db: Database, clock: HandClock, keeper: LeaseKeeper, model_id: str
) -> None:
    # The wall clock stepped back after the write: its stamp is in the future.
    [attempt] = held_attempts(hand_db, keeper, model_id, 1)
    attempt.wrote(clock.now_ms() + 60_000)
    assert cancel(hand_db, attempt.task_id, None).status_code == 202
    wait_until(lambda: attempt.stop_reason() is StopReason.CANCEL, timeout=5,
               what="the attempt told of its cancel")
