"""A running attempt outlives its PostgreSQL connections being ended under it (a DBA's
`pg_terminate_backend`, a pooler's restart): the write that met the drop is redone on a
fresh connection, unless it had landed, so the task completes in its one attempt with
a gapless log (docs/operations.md, "Faults and recovery")."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.settings import Settings
from core.states import TERMINAL, OnRestart, Status
from core.store import claims, completion, recovery, redo_dropped, worker_writes
from core.store.claims import Claim
from core.store.completion import Completion
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.store.transitions import Event
from core.store.worker_writes import OutputWrite
from scheduler.loop import SweeperLoop
from tests.engines import expected_text
from tests.scheduler.helpers import event_data, output_text, streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import (
    assert_log_sound,
    event_types,
    events_of,
    force,
    new_task,
    task_row,
)

WORDS = 40


def _terminate_writers(db: Database, *, until: Callable[[], bool], within: float) -> None:
    """End the store's backends caught in a transaction or a statement (the sweeper's
    writes: its flushes, its lease renewals, its completion) until `until()`, for at
    most `within` seconds. Idle ones would be replaced at their next checkout anyway
    (`core.store.connect`)."""
    deadline = time.monotonic() + within
    with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as admin:
        while not until() and time.monotonic() < deadline:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND state IN ('active', 'idle in transaction')")
            time.sleep(0.002)


def _count_redos(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """A list that grows by one each time a write met a dropped connection and asks
    what landed (`redo_dropped`); without that path it stays empty."""
    seen: list[None] = []
    not_landed = redo_dropped._not_landed

    def counted(*args: Any) -> list[int]:
        seen.append(None)
        return not_landed(*args)

    monkeypatch.setattr(redo_dropped, "_not_landed", counted)
    return seen


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no server
def test_an_attempt_streams_on_while_its_backends_are_terminated(
    db: Database, fast: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    redone = _count_redos(monkeypatch)
    task_id = new_task(db, model_id, input=f"words={WORDS} delay=0.04")
    # A flush every 10 ms, and no claim while the task runs: most drops hit its writes.
    sweeper = SweeperLoop(db, replace(fast, flush_interval_ms=10, worker_concurrency=1,
                                      upstream_concurrency=1))
    sweeper.start()
    try:
        wait_until(lambda: task_row(db, task_id).status == Status.RUNNING, timeout=5,
                   what="the attempt streaming")
        _terminate_writers(db, until=lambda: len(redone) >= 3, within=1.4)
        # 1.6 s of words: an attempt abandoned would wait out its 5 s lease instead
        wait_until(lambda: task_row(db, task_id).status in TERMINAL, timeout=4,
                   what="the task ending")
    finally:
        sweeper.stop()
    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert_log_sound(db, task_id)
    assert streamed_text(db, task_id) == expected_text(WORDS) == output_text(db, task_id)
    assert len(redone) >= 3  # the attempt's own writes met that many drops


LEASE_MS = 30_000


def _running(db: Database, model_id: str, **fields: Any) -> Claim:
    task_id = new_task(db, model_id, **fields)
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE_MS, node_id="node-a")
    assert claimed.task_id == task_id  # no task of an earlier case was due
    worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
    return claimed


def _dropped() -> OperationalError:
    """What a write raises when the server's session ended under it (SQLAlchemy saw the
    connection go): on PostgreSQL, whether its COMMIT went through is not known."""
    return OperationalError("COMMIT", None, Exception("server closed the connection"),
                            connection_invalidated=True)


def _drop_once(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, *,
               landed: bool, meanwhile: Callable[[], None] = lambda: None) -> list[str]:
    """Make `module.name`'s next call drop its connection, after its commit (`landed`)
    or before it wrote anything (then `meanwhile()` runs, as another writer would);
    later calls go through. The calls made, by how each went."""
    write = getattr(module, name)
    calls: list[str] = []

    def once(*args: Any) -> Any:
        if calls:
            calls.append("written")
            return write(*args)
        calls.append("dropped")
        if landed:
            write(*args)
        else:
            meanwhile()
        raise _dropped()

    monkeypatch.setattr(module, name, once)
    return calls


def _flush(claimed: Claim, text: str, before: str) -> OutputWrite:
    return OutputWrite(claimed.task_id, claimed.owner_token,
                       [Event("response.output_text.delta", {"delta": text})], text=text,
                       output_chars=len(before + text))


def test_a_write_whose_connection_dropped_is_written_once_whether_or_not_it_landed(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's flush, start and completion: one that committed before the drop is
    not written again (its acknowledgement alone was lost); one that did not is."""
    claimed = _running(db, model_id)
    for landed, text, before in ((True, "a", ""), (False, "b", "a")):
        calls = _drop_once(monkeypatch, worker_writes, "_append_outputs", landed=landed)
        worker_writes.append_one(db, _flush(claimed, text, before))
        assert calls == (["dropped"] if landed else ["dropped", "written"])
        monkeypatch.undo()
    calls = _drop_once(monkeypatch, completion, "_complete_all", landed=True)
    completion.complete_all(db, [Completion(claimed.task_id, claimed.owner_token, [],
                                            Usage(1, 2), "c", attempt=claimed.attempt)])
    assert calls == ["dropped"]
    assert streamed_text(db, claimed.task_id) == "ab"
    assert output_text(db, claimed.task_id) == "abc"
    assert task_row(db, claimed.task_id).status == Status.COMPLETED
    assert event_types(db, claimed.task_id).count("response.completed") == 1
    assert_log_sound(db, claimed.task_id)

    monkeypatch.undo()
    new_task(db, model_id)
    (loading,) = claims.claim(db, limit=1, lease_ms=LEASE_MS, node_id="node-a")
    calls = _drop_once(monkeypatch, worker_writes, "_start_alone", landed=True)
    worker_writes.start_running(db, loading.task_id, loading.owner_token)
    assert calls == ["dropped"]
    assert event_types(db, loading.task_id).count("response.in_progress") == 1
    assert_log_sound(db, loading.task_id)


def test_a_write_whose_connection_dropped_is_fenced_as_any_other(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task was taken by another owner meanwhile: the write is not redone, and its
    attempt stops as a lost lease stops it; a cancel meanwhile is honoured."""
    for change, refusal in (({"owner_token": "0" * 32}, LeaseLost),
                            ({"status": Status.CANCELLING.value}, CancelRequested)):
        claimed = _running(db, model_id)
        calls = _drop_once(monkeypatch, worker_writes, "_append_outputs", landed=False,
                           meanwhile=lambda: force(db, claimed.task_id, **change))
        with pytest.raises(refusal):
            worker_writes.append_one(db, _flush(claimed, "a", ""))
        assert calls == ["dropped"]
        assert streamed_text(db, claimed.task_id) == ""
        monkeypatch.undo()


def test_a_drop_that_outlasts_the_tries_is_raised_and_other_errors_at_once(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that stays away: after the last try the drop is raised (the attempt is
    abandoned, as before). Any other error, SQLite's locked file among them, is raised
    at once without another try."""
    claimed = _running(db, model_id)
    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01, 0.01))
    tries: list[None] = []

    def down(*_args: Any) -> Any:
        tries.append(None)
        raise _dropped()

    monkeypatch.setattr(worker_writes, "_append_outputs", down)
    with pytest.raises(OperationalError):
        worker_writes.append_one(db, _flush(claimed, "a", ""))
    assert len(tries) == 3
    locked = OperationalError("COMMIT", None, sqlite3.OperationalError("database is locked"))
    tries.clear()

    def busy(*_args: Any) -> Any:
        tries.append(None)
        raise locked

    monkeypatch.setattr(worker_writes, "_append_outputs", busy)
    with pytest.raises(OperationalError):
        worker_writes.append_one(db, _flush(claimed, "a", ""))
    assert len(tries) == 1


CODE, MESSAGE = "engine_error", "injected failure"


@dataclass(frozen=True)
class Ending:
    """One of an attempt's terminal writes: its transaction in `worker_writes` (`name`),
    the worker's call of it and what that answers, and what it leaves of a task the
    claim counted one attempt for: the status, the count and its one event."""

    name: str
    call: Callable[[Database, Claim], object]
    answer: object
    status: Status
    attempts: int
    event: str
    fields: dict[str, Any] = field(default_factory=dict)  # the task's (`new_task`)
    cancelling: bool = False  # a cancel was asked of the running attempt


def _requeue(db: Database, c: Claim) -> object:
    return worker_writes.requeue(db, c.task_id, c.owner_token, delay_ms=LEASE_MS, code=CODE,
                                 message=MESSAGE, attempt=c.attempt)


ENDINGS = [
    Ending("_requeue", _requeue, True, Status.QUEUED, 1, "response.queued"),
    Ending("_requeue", _requeue, False, Status.FAILED, 1, "response.failed",
           {"max_attempts": 1}),  # the attempts are spent: a dead letter
    Ending("_fail", lambda db, c: worker_writes.fail(db, c.task_id, c.owner_token, CODE,
                                                     MESSAGE, attempt=c.attempt),
           None, Status.FAILED, 1, "response.failed", {"on_restart": OnRestart.FAIL}),
    Ending("_release", lambda db, c: worker_writes.release(
        db, c.task_id, c.owner_token, delay_ms=LEASE_MS, attempt=c.attempt),
           None, Status.QUEUED, 0, "response.queued"),
    Ending("_finish_cancelled",
           lambda db, c: worker_writes.finish_cancelled(db, c.task_id, c.owner_token),
           None, Status.CANCELLED, 1, "response.cancelled", cancelling=True),
]


def _ending_attempt(db: Database, model_id: str, ending: Ending) -> tuple[Claim, list[str]]:
    """A running attempt about to make `ending`'s write, and its task's log so far (the
    tasks of the cases before are not due: requeued and released far ahead)."""
    claimed = _running(db, model_id, **ending.fields)
    if ending.cancelling:
        force(db, claimed.task_id, status=Status.CANCELLING.value)
    return claimed, event_types(db, claimed.task_id)


def test_an_attempts_ending_whose_connection_dropped_is_written_once(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeue (or its dead letter), a failure, a release and a cancel honoured: one
    that committed before the drop is not written again, one that did not is; either
    way the task ends as the write says, with its one event and the right count."""
    for ending in ENDINGS:
        for landed in (True, False):
            claimed, before = _ending_attempt(db, model_id, ending)
            monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01,))
            calls = _drop_once(monkeypatch, worker_writes, ending.name, landed=landed)
            assert ending.call(db, claimed) == ending.answer, ending
            assert calls == (["dropped"] if landed else ["dropped", "written"]), ending
            row = task_row(db, claimed.task_id)
            assert (row.status, row.attempts, row.owner_token) == (
                ending.status, ending.attempts, None), ending
            assert event_types(db, claimed.task_id) == [*before, ending.event], ending
            assert_log_sound(db, claimed.task_id)
            monkeypatch.undo()


def _lease_expired(db: Database, task_id: str, *, claimed: bool) -> None:
    """A sweeper's maintenance pass after the attempt's lease ran out (its restart
    policy), and then a claim (`claimed`): a task whose attempts are spent is
    dead-lettered by it."""
    force(db, task_id, lease_expires_at=1)
    assert sum(recovery.expire_leases(db).values()) == 1
    if claimed:
        claims.claim(db, limit=1, lease_ms=LEASE_MS, node_id="node-b")


def test_an_ending_that_did_not_land_is_not_mistaken_for_what_a_sweeper_did_meanwhile(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's lease ran out while its write met the drop, and lease expiry moved
    the task as its policy says (queued with the same count, failed under `fail`, a
    dead letter at the next claim): the attempt's write did not land, and it stops as
    a lost lease stops it, writing nothing. (A cancel's landing cannot be told from
    lease expiry's, which leaves the same task and log: `_cancelled_landed`.)"""
    for ending in ENDINGS:
        if ending.cancelling:
            continue
        claimed, before = _ending_attempt(db, model_id, ending)
        monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01,))
        calls = _drop_once(monkeypatch, worker_writes, ending.name, landed=False,
                           meanwhile=lambda: _lease_expired(db, claimed.task_id,
                                                            claimed=ending.answer is False))
        with pytest.raises(LeaseLost):
            ending.call(db, claimed)
        assert calls == ["dropped"], ending
        assert MESSAGE not in str(task_row(db, claimed.task_id).error_message), ending
        logged = [e.data for e in events_of(db, claimed.task_id)[len(before):]]
        assert logged and not any(CODE in data or "released" in data for data in logged)
        force(db, claimed.task_id, run_at=db.clock.now_ms() + LEASE_MS)  # not due again
        monkeypatch.undo()


def _terminate_at_commit(db: Database, monkeypatch: pytest.MonkeyPatch, name: str
                         ) -> list[int]:
    """The first call of `worker_writes.name` finds its connection's backend ended by
    `pg_terminate_backend` as it commits: a real drop, its transaction rolled back.
    The pids ended."""
    write = getattr(worker_writes, name)
    armed: list[int] = []  # the thread whose next commit meets the drop
    ended: list[int] = []

    def terminate(conn: Any) -> None:
        if armed and armed[0] == threading.get_ident():
            armed.clear()
            pid = conn.connection.dbapi_connection.info.backend_pid
            with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            ended.append(pid)

    def first_dropped(*args: Any) -> Any:
        if not ended:
            armed.append(threading.get_ident())
        return write(*args)

    event.listen(db.engine, "commit", terminate)
    monkeypatch.setattr(worker_writes, name, first_dropped)
    return ended


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no server
def test_a_retryable_failure_is_requeued_through_a_terminated_backend(
    db: Database, fast: Settings, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine's retryable failure meets `pg_terminate_backend` as its requeue
    commits: the requeue is written on a fresh one, and the next attempt runs
    after the backoff. Abandoned, the attempt waited out its lease and a task that must
    not restart (`on_restart=fail`) ended `worker_lost` after one attempt."""
    redone = _count_redos(monkeypatch)
    ended = _terminate_at_commit(db, monkeypatch, "_requeue")
    task_id = new_task(db, model_id, input="words=3 fail_at=1 fail=retryable",
                       on_restart=OnRestart.FAIL, max_attempts=2)
    sweeper = SweeperLoop(db, replace(fast, backoff_base_seconds=0.2, worker_concurrency=1))
    sweeper.start()
    try:
        wait_until(lambda: task_row(db, task_id).status in TERMINAL, timeout=4,
                   what="the task ending")
    finally:
        sweeper.stop()
    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.dead_lettered) == (Status.FAILED, 2, 1)
    assert row.error_code == "max_attempts_exceeded"
    [retry] = event_data(db, task_id, "response.queued")
    assert (retry["reason"], retry["attempt"], retry["error"]["code"]) == ("retry", 1, CODE)
    assert_log_sound(db, task_id)
    assert len(ended) == 1 and len(redone) == 1
