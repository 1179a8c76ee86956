"""Set-based worker writes, on SQLite and PostgreSQL alike: many tasks in one transaction,
each still fenced on its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.states import Status
from core.store import claims, completion, driver, pg_completion, tasks, worker_writes
from core.store.database import EVENTS_CHANNEL, Database, Logged
from core.store.transitions import Add, Event, Held, IfNull, Locked, move
from core.tables import responses
from core.tables import tasks as tasks_table
from tests.store.helpers import assert_log_sound, event_types, events_of, new_task, task_row

LEASE = 30_000


def done(text: str) -> list[Event]:
    return [Event("response.output_text.delta", {"delta": text}),
            Event("response.output_text.done", {"text": text})]


def completion_of(
    claimed: claims.Claim, text: str = "w0 ", **fields: object
) -> completion.Completion:
    values: dict[str, object] = {"task_id": claimed.task_id, "owner": claimed.owner_token,
                                 "closing": done(text), "usage": Usage(3, 1), "text": text,
                                 "start": True, **fields}
    return completion.Completion(**values)  # type: ignore[arg-type]


def claim_each(db: Database, count: int) -> list[claims.Claim]:
    """One claim per task: each holds its own owner token (a claim's tasks share one)."""
    return [claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")[0] for _ in range(count)]


def output_of(db: Database, task_id: str) -> str:
    with db.read() as conn:
        return str(conn.execute(select(responses.c.output_text)
                                .where(responses.c.task_id == task_id)).scalar_one())


@contextmanager
def counting_commits(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The transactions committed meanwhile: SQLAlchemy's commits and the statements
    that commit by themselves on an autocommit cursor (PostgreSQL's completion)."""
    commits: list[int] = []

    def count(_conn: object) -> None:
        commits.append(1)

    class Counted:
        def __init__(self, cursor: Any) -> None:
            self._cursor = cursor

        def execute(self, *args: Any) -> Any:
            commits.append(1)
            return self._cursor.execute(*args)

        def fetchone(self) -> Any:
            return self._cursor.fetchone()

    @contextmanager
    def counted(engine: Any) -> Iterator[Any]:
        with driver.autocommit_cursor(engine) as cursor:
            yield Counted(cursor)

    monkeypatch.setattr(pg_completion, "autocommit_cursor", counted)
    event.listen(db.engine, "commit", count)
    try:
        yield commits
    finally:
        event.remove(db.engine, "commit", count)


# --- complete_all ---------------------------------------------------------------------------

def test_complete_all_finishes_many_short_tasks_in_one_transaction(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [new_task(db, model_id) for _ in range(5)]
    batch = claims.claim(db, limit=5, lease_ms=LEASE, node_id="n")
    with counting_commits(db, monkeypatch) as commits:
        outcomes = completion.complete_all(
            db, [completion_of(c, f"t{i} ") for i, c in enumerate(batch)])
    assert outcomes == [None] * 5
    assert len(commits) == 1
    for i, task_id in enumerate(ids):
        row = task_row(db, task_id)
        assert (row.status, row.owner_token, row.lease_expires_at) == ("completed", None, None)
        assert event_types(db, task_id) == [
            "response.created", "response.loading", "response.in_progress",
            "response.output_text.delta", "response.output_text.done", "response.completed"]
        assert output_of(db, task_id) == f"t{i} "
        assert_log_sound(db, task_id)


def test_complete_all_is_committed_when_this_process_hears_its_events(
    db: Database, model_id: str
) -> None:
    # On PostgreSQL the completion's statement commits by itself (an autocommit cursor):
    # its events are still heard only once committed, and the connection goes back to
    # the pool as it came.
    for _ in range(3):
        new_task(db, model_id)
    batch = claims.claim(db, limit=3, lease_ms=LEASE, node_id="n")
    seen: list[tuple[str, str]] = []

    def hear(news: Logged) -> None:  # read on another connection: already committed
        seen.append((news.task_id, task_row(db, news.task_id).status))

    stop = db.listen(EVENTS_CHANNEL, hear)
    try:
        assert completion.complete_all(db, [completion_of(c) for c in batch]) == [None] * 3
    finally:
        stop()
    assert seen == [(c.task_id, "completed") for c in batch]
    if not db.is_sqlite:
        with db.engine.connect() as conn:
            driver_connection = conn.connection.driver_connection
            assert driver_connection.autocommit is False  # type: ignore[union-attr]


def test_complete_all_fences_each_task_on_its_own(db: Database, model_id: str) -> None:
    for _ in range(4):
        new_task(db, model_id)
    fine, stale, cancelled, running = claim_each(db, 4)
    tasks.cancel(db, cancelled.task_id, None)
    worker_writes.start_running(db, running.task_id, running.owner_token)
    untouched = {t.task_id: task_row(db, t.task_id).last_seq for t in (stale, cancelled)}

    outcomes = completion.complete_all(db, [
        completion_of(fine),
        completion_of(stale, owner="0" * 32),
        completion_of(cancelled),
        completion_of(running, start=False),
    ])

    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], LeaseLost)
    assert isinstance(outcomes[2], CancelRequested)
    assert task_row(db, fine.task_id).status == task_row(db, running.task_id).status == "completed"
    assert task_row(db, stale.task_id).status == "loading"
    assert task_row(db, cancelled.task_id).status == "cancelling"
    for task_id, last_seq in untouched.items():
        assert task_row(db, task_id).last_seq == last_seq
        assert output_of(db, task_id) == ""
    for claimed in (fine, stale, cancelled, running):
        assert_log_sound(db, claimed.task_id)


def test_complete_all_takes_closings_of_different_lengths(db: Database, model_id: str) -> None:
    for _ in range(3):
        new_task(db, model_id)
    short, longer, none = claims.claim(db, limit=3, lease_ms=LEASE, node_id="n")
    outcomes = completion.complete_all(db, [
        completion_of(short),
        completion_of(longer, closing=[*done("ab"), Event("response.content_part.done")],
                      text="ab"),
        completion_of(none, closing=[], text=""),
    ])
    assert outcomes == [None, None, None]
    assert event_types(db, longer.task_id)[-3:] == [
        "response.output_text.done", "response.content_part.done", "response.completed"]
    assert event_types(db, none.task_id)[-2:] == ["response.in_progress", "response.completed"]
    assert output_of(db, longer.task_id) == "ab"
    for claimed in (short, longer, none):
        assert_log_sound(db, claimed.task_id)


def test_a_stale_and_a_fresh_attempt_of_one_task_in_one_call(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id)
    stale = claims.claim(db, limit=1, lease_ms=LEASE, node_id="old")[0]
    worker_writes.release(db, task_id, stale.owner_token)
    fresh = claims.claim(db, limit=1, lease_ms=LEASE, node_id="new")[0]

    outcomes = completion.complete_all(
        db, [completion_of(stale, "old "), completion_of(fresh, "new ")])

    assert outcomes[0] is not None and isinstance(outcomes[0], LeaseLost)
    assert outcomes[1] is None
    assert output_of(db, task_id) == "new "
    assert event_types(db, task_id).count("response.completed") == 1
    assert_log_sound(db, task_id)


def test_complete_of_one_task_is_complete_all_of_one(db: Database, model_id: str) -> None:
    new_task(db, model_id)
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")
    with pytest.raises(LeaseLost):
        completion.complete(db, claimed.task_id, "0" * 32, [], usage=Usage(), start=True)
    completion.complete(db, claimed.task_id, claimed.owner_token, done("x"), usage=Usage(1, 1),
                        text="x", start=True)
    assert task_row(db, claimed.task_id).status == "completed"
    assert completion.complete_all(db, []) == []


# --- what `move` accepts ----------------------------------------------------------------------

def test_a_held_write_moves_exactly_the_pairs_that_still_hold(
    db: Database, model_id: str
) -> None:
    for _ in range(3):
        new_task(db, model_id)
    a, b, c = claim_each(db, 3)
    with db.write() as conn:
        rows = move(conn, now=1, expected={Status.LOADING}, to=Status.RUNNING,
                    events=[Event("response.in_progress")],
                    where=Held(((a.task_id, a.owner_token), (b.task_id, c.owner_token),
                                (c.task_id, "0" * 32))))
    assert [r.id for r in rows] == [a.task_id]
    assert [task_row(db, t.task_id).status for t in (a, b, c)] == ["running", "loading", "loading"]
    with pytest.raises(ValueError, match="twice"):
        Held(((a.task_id, a.owner_token), (a.task_id, b.owner_token)))


def test_add_and_if_null_values_work_prepared_or_not(db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id)
    with db.write() as conn:
        move(conn, now=1, expected={Status.QUEUED}, to=None, events=[],
             where=Locked((task_id,)), values={"attempts": Add(2), "started_at": IfNull(5)})
        move(conn, now=2, expected={Status.QUEUED}, to=None, events=[],
             where=[tasks_table.c.id == task_id],
             values={"attempts": Add(-1), "started_at": IfNull(9)})
        move(conn, now=3, expected={Status.QUEUED}, to=None, events=[],
             where=Locked((task_id,)), values={"attempts": tasks_table.c.attempts * 10})
    row = task_row(db, task_id)
    assert (row.attempts, row.started_at, row.updated_at) == (10, 5, 3)


def test_a_claim_brings_what_the_worker_needs_without_another_read(
    db: Database, model_id: str
) -> None:
    task_id = new_task(db, model_id, input="words=7")
    (claimed,) = claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")
    assert (claimed.task_id, claimed.model, claimed.attempt) == (task_id, model_id, 1)
    assert json.loads(claimed.request_json)["input"] == "words=7"
    assert (claimed.snapshot_json, claimed.output_text, claimed.usage) == (None, "", Usage())
    assert json.loads(events_of(db, task_id)[-1].data) == {"attempt": 1}
