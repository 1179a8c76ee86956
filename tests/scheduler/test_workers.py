"""Execution slots and the graceful stop of one worker process."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from core.settings import Settings
from core.states import OnRestart, Status
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from scheduler.attempt import Outcome
from scheduler.workers import Workers
from tests.engines import expected_text
from tests.scheduler.helpers import streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import event_types, events_of, new_task, task_row

LONG = "words=1000 delay=0.01"


def test_a_claim_takes_no_more_tasks_than_there_are_free_slots(
    db: Database, fast: Settings, model_id: str
) -> None:
    settings = replace(fast, worker_concurrency=2)
    ids = [new_task(db, model_id, input=LONG) for _ in range(5)]
    workers = Workers(db, settings)
    try:
        assert workers.claim() == 2
        assert workers.claim() == 0
        statuses = [task_row(db, task_id).status for task_id in ids]
        assert statuses.count(Status.QUEUED) == 3
    finally:
        workers.stop(drain_seconds=0)


def test_a_claim_for_upstream_slots_alone_leaves_the_local_backlog_standing(
    db: Database, fast: Settings, model_id: str
) -> None:
    """With every local slot busy, a claim still asks for upstream work (its slots are
    free): that it found none says nothing of the local tasks still queued."""
    settings = replace(fast, worker_concurrency=2)
    for _ in range(5):
        new_task(db, model_id, input=LONG)
    workers = Workers(db, settings)
    try:
        assert workers.claim() == 2
        assert not workers.caught_up()
        assert workers.claim() == 0  # the local slots are full; no upstream work exists
        assert not workers.caught_up()
    finally:
        workers.stop(drain_seconds=0)


def test_the_store_knows_the_tasks_this_process_runs_from_claim_to_end(
    db: Database, fast: Settings, model_id: str
) -> None:
    """`Database.held_here` (an API in this process polls those tasks' logs only as a
    safety net: `handlers.live`) holds a task while this process's worker runs it, and
    not once it ended, whether it completed or was handed back at a stop."""
    settings = replace(fast, worker_concurrency=2)
    done, held_back = (new_task(db, model_id, input="words=2 delay=0.3"),
                       new_task(db, model_id, input=LONG))
    workers = Workers(db, settings)
    try:
        assert workers.claim() == 2
        assert done in db.held_here and held_back in db.held_here
        wait_until(lambda: task_row(db, done).status == Status.COMPLETED, timeout=10,
                   what="the short task completed")
        wait_until(lambda: done not in db.held_here, timeout=5, what="the short task let go")
        assert held_back in db.held_here
    finally:
        workers.stop(drain_seconds=0)
    assert task_row(db, held_back).status == Status.QUEUED  # handed back
    assert held_back not in db.held_here


def test_graceful_stop_lets_work_finish_until_the_deadline_then_hands_back_the_rest(
    db: Database, fast: Settings, model_id: str
) -> None:
    short = new_task(db, model_id, input="words=5 delay=0.05")
    retry = new_task(db, model_id, input=LONG)
    resume = new_task(db, model_id, input=LONG, on_restart=OnRestart.RESUME)
    workers = Workers(db, fast)
    assert workers.claim() == 3
    wait_until(lambda: streamed_text(db, resume), timeout=10, what="resume task output")

    workers.stop(drain_seconds=1)

    assert workers.outcomes == {Outcome.COMPLETED: 1, Outcome.RELEASED: 2}
    assert task_row(db, short).status == Status.COMPLETED
    queued = task_row(db, retry)
    assert (queued.status, queued.attempts, queued.owner_token) == (Status.QUEUED, 0, None)
    assert json.loads(events_of(db, retry)[-1].data)["reason"] == "released"
    kept = task_row(db, resume)
    assert (kept.status, kept.attempts, kept.owner_token) == (Status.RUNNING, 0, None)
    assert json.loads(kept.snapshot_json)["pos"] == len(streamed_text(db, resume).split())
    assert "response.queued" not in event_types(db, resume)


# PostgreSQL only: SQLite admits one writer at a time, so a claim cannot overlap a commit.
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_claim_fills_the_slots_whose_completions_still_wait_for_their_commit(
    db: Database, fast: Settings, model_id: str
) -> None:
    """A slot is free once its attempt handed its completion to the group commit: the
    next claim does not wait for that commit, and the completion still lands once."""
    settings = replace(fast, worker_concurrency=2)
    first = [new_task(db, model_id, input="words=1") for _ in range(2)]
    workers = Workers(db, settings)
    dsn = libpq_conninfo(db.engine)
    try:
        with psycopg.connect(dsn) as blocker:  # their completion waits for these rows
            blocker.execute("SELECT 1 FROM responses WHERE task_id = ANY(%s) FOR UPDATE",
                            [first])
            every = workers.free_slots()  # local slots and upstream ones
            assert workers.claim() == 2
            wait_until(lambda: workers.free_slots() == every, timeout=10,
                       what="both slots handed over")
            later = [new_task(db, model_id, input="words=1") for _ in range(2)]
            assert workers.claim() == 2
            assert [task_row(db, t).status for t in first] == [Status.LOADING] * 2
            blocker.rollback()
        wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == 4, timeout=20,
                   what="all four completed")
    finally:
        workers.stop(drain_seconds=5)
    for task_id in first + later:
        assert event_types(db, task_id).count("response.completed") == 1
        assert task_row(db, task_id).status == Status.COMPLETED


def _runner_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("taskward-runner")}


def _recording_threads(workers: Workers) -> dict[str, int]:
    """Which thread started each attempt (task id -> thread ident)."""
    started: dict[str, int] = {}
    run_here = workers._run_here

    def recorded(attempt: Any, verify: Any) -> None:
        started[attempt.task_id] = threading.get_ident()
        run_here(attempt, verify)

    workers._run_here = recorded  # type: ignore[method-assign]
    return started


def test_a_claims_short_attempts_run_in_turn_on_one_engine_thread(
    db: Database, fast: Settings, model_id: str
) -> None:
    workers = Workers(db, fast)
    try:  # a first task loads the engine and its modules, which takes longer
        new_task(db, model_id, input="words=2")
        assert workers.claim() == 1
        wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == 1, timeout=10,
                   what="the first task")
        ids = [new_task(db, model_id, input="words=2") for _ in range(4)]
        started = _recording_threads(workers)
        assert workers.claim() == 4
        wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == 5, timeout=10,
                   what="the four tasks")
    finally:
        workers.stop(drain_seconds=5)
    assert sorted(started) == sorted(ids)
    assert len(set(started.values())) == 1
    for task_id in ids:
        assert streamed_text(db, task_id) == expected_text(2)
        assert task_row(db, task_id).status == Status.COMPLETED


def short_then_slow(db: Database, workers: Workers, slow: str, claimed: int,
                    short_done: Callable[[], bool], what: str) -> None:
    """Claim `claimed` tasks; the short ones are done (`short_done`) while `slow` (6 s)
    still runs, and then it completes too. Whichever comes first is waited for, not a
    fixed time: a loaded machine (two pytest processes on two cores) may take seconds
    over the short ones, but not make them wait for the slow one's end."""
    assert workers.claim() == claimed
    wait_until(lambda: short_done() or task_row(db, slow).status == Status.COMPLETED,
               timeout=30, what=what)
    assert short_done() and task_row(db, slow).status != Status.COMPLETED, (
        f"{what} waited for the slow one")
    wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == claimed, timeout=30,
               what="the slow task")


def test_attempts_behind_a_long_one_in_a_claim_start_on_threads_of_their_own(
    db: Database, fast: Settings, model_id: str
) -> None:
    """A long engine first in a claim does not hold the rest back beyond the hand-over
    time: they start on other engine threads and complete while it still runs."""
    slow = new_task(db, model_id, input="words=4 delay=1.5")
    short = [new_task(db, model_id, input="words=2") for _ in range(3)]
    workers = Workers(db, fast)
    started = _recording_threads(workers)
    try:
        short_then_slow(db, workers, slow, 4, lambda: workers.outcomes[Outcome.COMPLETED] == 3,
                        "the three short tasks")
    finally:
        workers.stop(drain_seconds=5)
    assert all(started[task_id] != started[slow] for task_id in short)
    for task_id in (slow, *short):
        assert event_types(db, task_id).count("response.completed") == 1


def test_a_finished_attempt_is_written_while_a_long_one_after_it_in_the_claim_runs(
    db: Database, fast: Settings, model_id: str
) -> None:
    """The short attempt's completion waits in the group commit for its batch; the long
    one after it on the same engine thread must not hold it there (its result, a cancel
    of it, a crash's recovery all see it `loading` until then)."""
    short = new_task(db, model_id, input="words=2")
    slow = new_task(db, model_id, input="words=4 delay=1.5")  # 6 s
    workers = Workers(db, fast)
    try:
        short_then_slow(db, workers, slow, 2,
                        lambda: task_row(db, short).status == Status.COMPLETED,
                        "the short task's completion")
    finally:
        workers.stop(drain_seconds=5)
    assert streamed_text(db, short) == expected_text(2)
    assert event_types(db, short).count("response.completed") == 1


def test_a_short_attempt_runs_whole_on_its_engine_thread_and_a_long_one_gets_a_runner(
    db: Database, fast: Settings, model_id: str
) -> None:
    """An engine that returns at once is streamed by its own thread (no runner thread
    starts); one still running after the hand-over time is streamed by a runner, and
    both complete with all their text, once."""
    before = _runner_threads()
    short = new_task(db, model_id, input="words=3")
    workers = Workers(db, fast)
    try:
        assert workers.claim() == 1
        wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == 1, timeout=10,
                   what="the short task")
        assert _runner_threads() == before
        slow = new_task(db, model_id, input="words=3 delay=0.1")  # 100 ms before each word
        assert workers.claim() == 1
        wait_until(lambda: workers.outcomes[Outcome.COMPLETED] == 2, timeout=10,
                   what="the slow task")
        assert _runner_threads() - before
    finally:
        workers.stop(drain_seconds=5)
    for task_id in (short, slow):
        assert streamed_text(db, task_id) == expected_text(3)
        assert event_types(db, task_id).count("response.completed") == 1
        assert task_row(db, task_id).status == Status.COMPLETED
