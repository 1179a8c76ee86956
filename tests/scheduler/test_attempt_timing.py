"""When a runner must look at its attempt without being woken: at the deadline and at
the lease's end, never on a fixed tick while nothing is due."""

from __future__ import annotations

import time
from dataclasses import replace

from core.engines.base import Usage
from core.settings import Settings
from core.store import claims
from core.store.claims import Claim
from core.store.database import Database
from scheduler.attempt import LONGEST_SLEEP_MS, RENEWAL_TICK_MS, Attempt, Outcome
from scheduler.execute import execute
from tests.clocks import HandClock
from tests.store.helpers import new_task


def _attempt(clock: HandClock, *, timeout_ms: int = 600_000, lease_ms: int = 30_000) -> Attempt:
    claim = Claim("resp_x", "owner", 1, False, "m", "{}", None, "", Usage())
    return Attempt(claim, clock=clock, timeout_ms=timeout_ms, lease_ms=lease_ms)


def test_a_runner_with_nothing_due_waits_until_the_lease_end_or_the_deadline() -> None:
    clock = HandClock(1_000_000)
    assert _attempt(clock, timeout_ms=400, lease_ms=30_000).ms_until_timed_stop(clock.ms) == 400
    assert _attempt(clock, lease_ms=700).ms_until_timed_stop(clock.ms) == 700


def test_a_long_wait_is_cut_to_the_longest_sleep() -> None:
    clock = HandClock(1_000_000)
    assert _attempt(clock).ms_until_timed_stop(clock.ms) == LONGEST_SLEEP_MS


def test_past_the_lease_end_with_a_renewal_overdue_the_runner_looks_every_tick() -> None:
    clock = HandClock(1_000_000)
    attempt = _attempt(clock, lease_ms=500)
    attempt.renewing(clock.ms + 100)  # under way, not answered: no flag will come
    clock.ms += 600
    assert attempt.ms_until_timed_stop(clock.ms) == RENEWAL_TICK_MS


def test_a_deadline_already_past_is_due_at_once() -> None:
    clock = HandClock(1_000_000)
    attempt = _attempt(clock, timeout_ms=100)
    clock.ms += 250
    assert attempt.ms_until_timed_stop(clock.ms) == 0


def test_a_runner_sleeps_through_an_engine_that_is_silent(
    db: Database, fast: Settings, model_id: str
) -> None:
    """The engine says nothing for 1.2 s before each of its two words: the runner waits
    for it without looking on a tick (it used to wake every 50 ms: ~50 times here)."""
    settings = replace(fast, heartbeat_seconds=10, lease_seconds=30)
    task_id = new_task(db, model_id, input="words=2 delay=1.2")
    [claim] = claims.claim(db, limit=1, lease_ms=30_000, node_id="node")
    attempt = Attempt(claim, clock=db.clock, timeout_ms=60_000, lease_ms=30_000)
    takes = 0
    take = attempt.inbox.take

    def counted(timeout_s: float, *, room_bytes: int | None) -> list[object]:
        nonlocal takes
        takes += 1
        return take(timeout_s, room_bytes=room_bytes)

    attempt.inbox.take = counted  # type: ignore[method-assign]
    started = time.monotonic()
    assert execute(db, settings, attempt) is Outcome.COMPLETED
    assert time.monotonic() - started >= 2.4
    # Each word, its flush and the end wake the runner, and the longest sleep ends a
    # wait once a second: a dozen at most, against ~50 on a 50 ms tick.
    assert takes <= 12, f"the runner woke {takes} times for a task {task_id} of two words"
