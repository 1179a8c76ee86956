"""An attempt whose engine waits for room (the local engine's KV cells) does not spend
its execution timeout on the wait; a cancel or a lost lease still stops it at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from core.engines.base import (
    Chunk,
    Emit,
    EngineOptions,
    ExcludesWaits,
    GenerationRequest,
    ModelSource,
    Usage,
)
from core.engines.registry import register_engine
from core.models_registry import register
from core.settings import Settings
from core.states import Status
from core.store.claims import Claim
from core.store.database import Database
from core.store.tasks import cancel
from scheduler.attempt import LONGEST_SLEEP_MS, Attempt, StopReason
from scheduler.workers import Workers
from tests.clocks import HandClock
from tests.engines import parse_directives
from tests.scheduler.helpers import output_text, run_pass
from tests.scheduler.processes import wait_until
from tests.store.helpers import new_task, task_row


def _attempt(clock: HandClock, *, timeout_ms: int, lease_ms: int = 30_000) -> Attempt:
    claim = Claim("resp_x", "owner", 1, False, "m", "{}", None, "", Usage())
    return Attempt(claim, clock=clock, timeout_ms=timeout_ms, lease_ms=lease_ms)


def test_the_time_an_engine_waits_for_room_is_left_out_of_the_timeout() -> None:
    clock = HandClock(1_000_000)
    attempt = _attempt(clock, timeout_ms=1_000)
    clock.ms += 300
    attempt.should_stop.waiting(True)
    clock.ms += 5_000

    assert attempt.stop_reason() is None
    assert attempt.ms_until_timed_stop(clock.ms) == LONGEST_SLEEP_MS
    attempt.should_stop.waiting(False)
    clock.ms += 699
    assert attempt.stop_reason() is None
    clock.ms += 1
    assert attempt.stop_reason() is StopReason.TIMEOUT


def test_a_cancel_stops_an_attempt_waiting_for_room_at_once() -> None:
    clock = HandClock(1_000_000)
    attempt = _attempt(clock, timeout_ms=1_000)
    poll = attempt.should_stop
    poll.waiting(True)
    assert not poll()

    attempt.raise_flag(StopReason.CANCEL)

    assert poll()
    assert attempt.stop_reason() is StopReason.CANCEL


def test_a_lapsed_lease_stops_an_attempt_waiting_for_room() -> None:
    clock = HandClock(1_000_000)
    attempt = _attempt(clock, timeout_ms=60_000, lease_ms=500)
    attempt.should_stop.waiting(True)
    attempt.renewal_failed()
    clock.ms += 600

    assert attempt.stop_reason() is StopReason.LOST


class _WaitingModel:
    """Waits `wait=S` seconds for room as the local engine's loop does (telling the
    attempt, and polling it), then makes one word."""

    def generate(self, request: GenerationRequest, snapshot: object,
                 should_stop: Callable[[], bool], emit: Emit | None = None) -> Iterator[Chunk]:
        wait = float(parse_directives(request.messages[-1]["content"])["wait"])
        told = should_stop if isinstance(should_stop, ExcludesWaits) else None
        if told:
            told.waiting(True)
        until = time.monotonic() + wait
        while time.monotonic() < until:
            if should_stop():
                return
            time.sleep(0.02)
        if told:
            told.waiting(False)
        yield Chunk("ran ", {}, Usage(1, 1))


class _WaitingEngine:
    name = "test.fe_waiting"

    def __init__(self, options: EngineOptions) -> None:
        pass

    def load(self, model: ModelSource) -> _WaitingModel:
        return _WaitingModel()


def _waiting_model(db: Database, settings: Settings) -> str:
    register_engine(_WaitingEngine.name, _WaitingEngine)
    (settings.models_dir / "waiting.bin").write_bytes(b"waiting\n")
    register(db, settings.models_dir, "waiting.bin", model_id="waiting",
             engine=_WaitingEngine.name)
    return "waiting"


def test_a_task_that_waits_for_room_longer_than_its_timeout_then_runs_completes(
    db: Database, fast: Settings
) -> None:
    settings = replace(fast, task_timeout_seconds=0.5)
    task_id = new_task(db, _waiting_model(db, settings), input="wait=1.2", max_attempts=1)

    assert run_pass(db, settings)["completed"] == 1
    assert task_row(db, task_id).status == Status.COMPLETED
    assert output_text(db, task_id) == "ran "


def test_cancelling_a_task_that_waits_for_room_ends_it_at_once(
    db: Database, fast: Settings
) -> None:
    settings = replace(fast, flush_interval_ms=200, heartbeat_seconds=4)
    task_id = new_task(db, _waiting_model(db, settings), input="wait=60")
    workers = Workers(db, settings)
    workers.claim()
    wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=10,
               what="running")

    started = time.monotonic()
    assert cancel(db, task_id, None).status_code == 202
    wait_until(lambda: task_row(db, task_id).status == Status.CANCELLED, timeout=5,
               what="cancelled")
    workers.stop(drain_seconds=0)
    assert time.monotonic() - started < 5
