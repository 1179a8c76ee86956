"""A group commit's births statement whose connection is lost once it was sent (a
network blip, a pooler's restart) may have committed with only its reply lost. Its
task ids were made before it was sent: what landed is read on a fresh connection and
answered as made, with the request's first answer; only what did not land is made
again, with the same ids; a store still away is `503` for the batch, never a second
making (docs/operations.md, "Faults and recovery"). Before, the batch was taken for
"nothing stored" and each request made afresh: one `202`, two tasks, both run.

PostgreSQL alone: SQLite has no connection to lose, and its batches are transactions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from litestar.testing import TestClient
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from core.idempotency import IdempotencyClaim
from core.store import births, new_tasks, redo_dropped
from core.store.births import NewTask
from core.store.database import Database
from core.store.driver import sqlalchemy_error
from core.store.new_tasks import Enqueued
from core.tables import tasks
from handlers.enqueuing import Enqueuer
from handlers.threads import store_unavailable
from tests.api.helpers import Caller

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

Requests = list[tuple[NewTask, IdempotencyClaim | None]]


def _lost() -> psycopg.OperationalError:
    """What psycopg raises when the server's socket closes before its reply is read."""
    return psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly")


class ReplyLost:
    """The event loop's next statement (`core.store.pg_async`) loses its connection:
    `after` it was executed and committed on the server, before its reply was read
    (the acknowledgement lost), or before it was sent (nothing landed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, after: bool) -> None:
        self.armed = True
        execute = psycopg.AsyncCursor.execute

        async def lost_once(cursor: psycopg.AsyncCursor[Any], *args: Any, **kwargs: Any) -> Any:
            if not self.armed:
                return await execute(cursor, *args, **kwargs)
            self.armed = False
            if after:
                await execute(cursor, *args, **kwargs)
            await cursor.connection.close()
            raise _lost()

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", lost_once)


def _requests(model: str, count: int, *, keyed: bool = False) -> Requests:
    return [(NewTask(client_id="c", model=model, request_json=json.dumps({"input": "words=1"})),
             IdempotencyClaim(f"key-{n}", "digest") if keyed else None) for n in range(count)]


def _together(db: Database, requests: Requests) -> list[Enqueued | BaseException]:
    """`requests` sent at once: one batch on the event loop."""
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)

    async def all_at_once() -> list[Enqueued | BaseException]:
        try:
            return await asyncio.gather(*(enqueuer.enqueue(new, claim) for new, claim in requests),
                                        return_exceptions=True)
        finally:
            await enqueuer.close()

    return asyncio.run(all_at_once())


def _stored(db: Database) -> list[str]:
    """Every task's id, read on a connection of the test's own."""
    with db.engine.connect() as conn:
        return sorted(conn.execute(select(tasks.c.id)).scalars())


def _first_answers(answers: list[Enqueued | BaseException]) -> list[str]:
    """The ids `answers` name, each a request's first `202` (no replay)."""
    assert all(isinstance(a, Enqueued) and (a.status_code, a.replayed) == (202, False)
               for a in answers), answers
    return sorted(a.task_id for a in answers if isinstance(a, Enqueued))


@pytest.fixture
def fast_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", (0.0, 0.0, 0.0))


def test_a_batch_whose_reply_is_lost_after_its_commit_is_stored_once(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, fast_tries: None
) -> None:
    lost = ReplyLost(monkeypatch, after=True)

    answers = _together(db, _requests(model_id, 5))

    assert not lost.armed
    answered = _first_answers(answers)
    assert len(set(answered)) == 5
    assert _stored(db) == answered


def test_a_batch_lost_before_it_landed_is_made_once_with_its_own_ids(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, fast_tries: None
) -> None:
    made: list[list[str]] = []
    born = new_tasks._born

    def counted(db: Database, batch: Any) -> list[Enqueued | None]:
        made.append(sorted(row["id"] for row in batch.rows))
        return born(db, batch)

    monkeypatch.setattr(new_tasks, "_born", counted)
    lost = ReplyLost(monkeypatch, after=False)

    answers = _together(db, _requests(model_id, 5))

    assert not lost.armed
    answered = _first_answers(answers)
    assert _stored(db) == answered
    assert made == [answered]  # the ids made for the lost statement, written once


def test_a_keyed_first_send_whose_reply_is_lost_is_not_answered_as_a_replay(
    db: Database, http: TestClient[Any], alice: Caller, model_id: str,
    monkeypatch: pytest.MonkeyPatch, fast_tries: None,
) -> None:
    body = {"model": model_id, "input": "words=3"}
    lost = ReplyLost(monkeypatch, after=True)

    first = alice.post("/v1/responses", json=body, headers={"Idempotency-Key": "k-1"})

    assert not lost.armed
    assert first.status_code == 202, first.text
    assert "Idempotent-Replayed" not in first.headers
    assert _stored(db) == [first.json()["id"]]
    again = alice.post("/v1/responses", json=body, headers={"Idempotency-Key": "k-1"})
    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (202, "true")
    assert again.json()["id"] == first.json()["id"]


def test_a_birth_still_running_when_its_landing_was_read_is_answered_once(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, fast_tries: None
) -> None:
    """The lost statement was still running on the server (waiting for a key's lock,
    say) when its rows were looked for, and committed after: the redo, with the same
    ids, waits for those rows and inserts none; they are found by their ids."""
    landed = new_tasks._landed
    looks: list[str] = []

    def looked_too_early(conn: Any, ready: Enqueued) -> Any:
        looks.append(ready.task_id)
        return redo_dropped.NOT_LANDED if len(looks) <= 3 else landed(conn, ready)

    monkeypatch.setattr(new_tasks, "_landed", looked_too_early)
    ReplyLost(monkeypatch, after=True)

    answers = _together(db, _requests(model_id, 3))

    answered = _first_answers(answers)
    assert _stored(db) == answered
    assert len(looks) == 6  # three too early, then each found after the redo


def test_a_store_still_away_after_the_lost_reply_is_503_and_makes_nothing_more(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, fast_tries: None
) -> None:
    reads: list[int] = []

    def store_away() -> Any:
        reads.append(1)
        raise sqlalchemy_error(_lost(), db.engine.dialect)

    monkeypatch.setattr(db, "read", store_away)
    ReplyLost(monkeypatch, after=True)

    answers = _together(db, _requests(model_id, 4))

    assert all(isinstance(a, OperationalError) and store_unavailable(a) for a in answers)
    assert len(reads) == len(redo_dropped.TRY_PAUSES_SECONDS)  # each try read, none wrote
    assert len(_stored(db)) == 4  # those the lost reply committed, and no more


def _reply_lost_once(monkeypatch: pytest.MonkeyPatch, db: Database) -> Callable[[], bool]:
    """`insert_rows_alone` (the writer thread's births) commits, then its connection is
    lost before the reply: once. Answers whether it has been."""
    insert = births.insert_rows_alone
    lost: list[bool] = []

    def lost_once(*args: Any, **kwargs: Any) -> set[str]:
        inserted = insert(*args, **kwargs)
        if not lost:
            lost.append(True)
            raise sqlalchemy_error(_lost(), db.engine.dialect)
        return inserted

    monkeypatch.setattr(new_tasks, "insert_rows_alone", lost_once)
    return lambda: bool(lost)


def test_births_on_the_writer_thread_whose_reply_is_lost_are_stored_once(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, fast_tries: None
) -> None:
    """`enqueue_many`'s batch of births alone, as any caller off the event loop makes
    it: its answers are those of the tasks that landed, none left to be made afresh."""
    was_lost = _reply_lost_once(monkeypatch, db)

    answers = new_tasks.enqueue_many(db, _requests(model_id, 3, keyed=True),
                                     idempotency_ttl_ms=60_000)

    assert was_lost()
    answered = _first_answers([a for a in answers if a is not None])
    assert len(answered) == 3
    assert _stored(db) == answered
