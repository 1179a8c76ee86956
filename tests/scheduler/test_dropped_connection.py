"""A running attempt outlives its PostgreSQL connections being ended under it (a DBA's
`pg_terminate_backend`, a pooler's restart): the write that met the drop is redone on a
fresh connection, unless it had landed, so the task completes in its one attempt with
a gapless log (docs/operations.md, "Faults and recovery")."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.settings import Settings
from core.states import TERMINAL, Status
from core.store import claims, completion, redo_dropped, worker_writes
from core.store.claims import Claim
from core.store.completion import Completion
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.store.transitions import Event
from core.store.worker_writes import OutputWrite
from scheduler.loop import SweeperLoop
from tests.engines import expected_text
from tests.scheduler.helpers import output_text, streamed_text
from tests.scheduler.processes import wait_until
from tests.store.helpers import assert_log_sound, event_types, force, new_task, task_row

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


def _running(db: Database, model_id: str) -> Claim:
    new_task(db, model_id)
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE_MS, node_id="node-a")
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
