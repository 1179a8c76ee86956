"""A claim whose COMMIT went through and whose reply was lost (a network blip, a
pooler's restart) spends no attempt: the tasks it took are handed back as a graceful
stop hands them back, and the drop is raised as before (docs/operations.md, "Faults
and recovery"). Left under an owner token nobody held, they waited out their lease,
and an `on_restart: fail` task ended `worker_lost`, a last attempt a dead letter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from core.engines.base import Usage
from core.states import OnRestart, Status
from core.store import claims, completion, pg_claims, redo_dropped, worker_writes
from core.store.database import Database
from core.store.driver import autocommit_cursor
from tests.store.helpers import assert_log_sound, event_types, events_of, force, new_task, task_row

LEASE_MS = 30_000


def _dropped() -> OperationalError:
    """What a claim raises when its session ended under it (SQLAlchemy saw the
    connection go): whether its COMMIT went through is not known."""
    return OperationalError("COMMIT", None, Exception("server closed the connection"),
                            connection_invalidated=True)


def _claim(db: Database) -> list[claims.Claim]:
    return claims.claim(db, limit=10, lease_ms=LEASE_MS, node_id="node-a")


def _tasks(db: Database, model_id: str, *, waiting: bool) -> dict[str, str]:
    """Tasks of the kinds a claim takes, by role: a resumable `resume` task (one attempt
    spent), a task that may not restart and has one attempt, and (`waiting`) one whose
    `run_at` came while it waited outside the line: on PostgreSQL the claim then is a
    transaction, not the one statement of `pg_claims.claim_alone`."""
    resume = new_task(db, model_id, on_restart=OnRestart.RESUME)
    [held] = _claim(db)
    worker_writes.start_running(db, held.task_id, held.owner_token)
    force(db, resume, lease_expires_at=1)
    ids = {"resume": resume,
           "once": new_task(db, model_id, on_restart=OnRestart.FAIL, max_attempts=1)}
    if waiting:
        ids["waiting"] = new_task(db, model_id)
        force(db, ids["waiting"], vtime=None)
    return ids


def _state(db: Database, ids: dict[str, str]) -> dict[str, Any]:
    return {role: (task_row(db, task_id)._asdict(), event_types(db, task_id))
            for role, task_id in ids.items()}


def _claim_raises(db: Database) -> OperationalError:
    with pytest.raises(OperationalError) as raised:
        _claim(db)
    return raised.value


def _assert_handed_back(db: Database, ids: dict[str, str], before: dict[str, Any]) -> None:
    """Each task as a graceful stop leaves it: the claim's attempt refunded, its event
    followed by the hand-back's (a `resume` task's hand-back logs none); then the next
    claim takes them all, and they complete in the attempt it counts."""
    for role, task_id in ids.items():
        row, events = task_row(db, task_id), event_types(db, task_id)
        assert (row.owner_token, row.lease_expires_at) == (None, None), role
        if role == "resume":
            assert (row.status, row.attempts) == (Status.RUNNING, 1)
            assert events == [*before[role][1], "response.in_progress"]
        else:
            assert (row.status, row.attempts) == (Status.QUEUED, 0), role
            assert events == [*before[role][1], "response.loading", "response.queued"], role
            assert json.loads(events_of(db, task_id)[-1].data)["reason"] == "released"
        assert_log_sound(db, task_id)
    taken = _claim(db)
    assert sorted(c.task_id for c in taken) == sorted(ids.values())
    assert not any(completion.complete_all(db, [
        completion.Completion(c.task_id, c.owner_token, [], Usage(1, 1), "x",
                              start=not c.resumed, attempt=c.attempt) for c in taken]))
    for role, task_id in ids.items():
        row = task_row(db, task_id)
        assert (row.status, row.attempts) == (Status.COMPLETED, 2 if role == "resume" else 1)
        assert_log_sound(db, task_id)


def _reply_lost_once(monkeypatch: pytest.MonkeyPatch, db: Database, *, landed: bool,
                     meanwhile: Any = lambda: None) -> list[OperationalError]:
    """The next transaction of `db.write_events` (the claim's) commits (`landed`, then
    `meanwhile()` runs, as another writer would) or writes nothing, and its reply never
    comes; later ones go through. The drops raised."""
    write_events = db.write_events
    raised: list[OperationalError] = []

    @contextmanager
    def once() -> Iterator[Any]:
        if raised:
            with write_events() as conn:
                yield conn
            return
        raised.append(_dropped())
        if not landed:
            raise raised[0]
        with write_events() as conn:
            yield conn
        meanwhile()
        raise raised[0]

    monkeypatch.setattr(db, "write_events", once)
    return raised


def test_a_claim_transaction_whose_reply_was_lost_hands_its_tasks_back(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's transaction (SQLite's; PostgreSQL's when a waiting task is due): not
    landed, nothing changes; landed, its tasks are handed back, and one whose cancel
    came meanwhile is cancelled."""
    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01,))
    ids = _tasks(db, model_id, waiting=True)
    before = _state(db, ids)
    raised = _reply_lost_once(monkeypatch, db, landed=False)
    assert _claim_raises(db) is raised[0]
    assert _state(db, ids) == before
    monkeypatch.undo()

    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01,))
    cancelled = new_task(db, model_id, client="client-b")
    cancelled_before = event_types(db, cancelled)
    raised = _reply_lost_once(monkeypatch, db, landed=True, meanwhile=lambda: force(
        db, cancelled, status=Status.CANCELLING.value))
    assert _claim_raises(db) is raised[0]
    row = task_row(db, cancelled)
    assert (row.status, row.attempts, row.owner_token) == (Status.CANCELLED, 1, None)
    assert event_types(db, cancelled) == [*cancelled_before, "response.loading",
                                          "response.cancelled"]
    assert_log_sound(db, cancelled)
    _assert_handed_back(db, ids, before)


class _ReplyLost:
    """A driver cursor whose statement commits (`landed`) or is never sent, and whose
    reply never comes: the connection drops, as libpq reports it."""

    def __init__(self, cursor: Any, landed: bool) -> None:
        self.__dict__.update(cursor=cursor, landed=landed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["cursor"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["cursor"], name, value)

    def execute(self, *args: Any) -> None:
        if self.__dict__["landed"]:
            self.__dict__["cursor"].execute(*args)
        raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # its one statement
def test_a_one_statement_claim_whose_reply_was_lost_hands_its_tasks_back(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's claim as one statement committing by itself (`claim_alone`)."""
    ids = _tasks(db, model_id, waiting=False)
    before = _state(db, ids)
    for landed in (False, True):
        @contextmanager
        def reply_lost(engine: Engine, landed: bool = landed) -> Iterator[Any]:
            with autocommit_cursor(engine) as cursor:
                yield _ReplyLost(cursor, landed)

        monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01,))
        monkeypatch.setattr(pg_claims, "autocommit_cursor", reply_lost)
        _claim_raises(db)
        monkeypatch.undo()
        if not landed:
            assert _state(db, ids) == before
    _assert_handed_back(db, ids, before)


def test_a_claim_whose_store_stays_away_leaves_its_tasks_to_their_leases(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim landed, but no fresh connection answers within the tries: the drop is
    raised, and the tasks wait out their leases as before."""
    task_id = new_task(db, model_id)
    force(db, task_id, vtime=None)  # PostgreSQL's claim then is a transaction too
    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.01, 0.01))
    raised = _reply_lost_once(monkeypatch, db, landed=True)
    tries: list[None] = []

    def away() -> Any:
        tries.append(None)
        raise _dropped()

    monkeypatch.setattr(db, "read", away)
    assert _claim_raises(db) is raised[0]
    monkeypatch.undo()
    assert len(tries) == 2
    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.lease_expires_at is not None) == (
        Status.LOADING, 1, True)
