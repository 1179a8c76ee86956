"""Small builders shared by the store tests."""

from __future__ import annotations

import json
import threading
from typing import Any

from sqlalchemy import select, text, update

from core.objects import TERMINAL_EVENTS
from core.states import OnRestart
from core.store.births import NewTask
from core.store.database import Database
from core.store.new_tasks import enqueue
from core.tables import task_events, tasks


def new_task(db: Database, model: str, *, client: str = "client-a", **fields: Any) -> str:
    request = {"model": model, "input": fields.pop("input", "words=3")}
    fields.setdefault("on_restart", OnRestart.RETRY)
    return enqueue(db, NewTask(client_id=client, model=model,
                               request_json=json.dumps(request), **fields)).task_id


def task_row(db: Database, task_id: str) -> Any:
    with db.read() as conn:
        return conn.execute(select(tasks).where(tasks.c.id == task_id)).one()


def events_of(db: Database, task_id: str) -> list[Any]:
    with db.read() as conn:
        return list(conn.execute(
            select(task_events).where(task_events.c.task_id == task_id)
            .order_by(task_events.c.seq)))


def event_types(db: Database, task_id: str) -> list[str]:
    return [e.type for e in events_of(db, task_id)]


def force(db: Database, task_id: str, **values: Any) -> None:
    """Put a task into a state directly, to set up recovery cells (test-only shortcut)."""
    with db.write() as conn:
        conn.execute(update(tasks).where(tasks.c.id == task_id).values(**values))


def assert_log_sound(db: Database, task_id: str) -> None:
    """Gapless seq from 1, `last_seq` agrees, at most one terminal event and it is last."""
    events = events_of(db, task_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert task_row(db, task_id).last_seq == len(events)
    terminal = [i for i, e in enumerate(events) if e.type in TERMINAL_EVENTS]
    assert len(terminal) <= 1
    if terminal:
        assert terminal[0] == len(events) - 1


def fill_line(db: Database, model: str, *, clients: int, per_client: int,
              analyze: bool = True) -> None:
    """`clients × per_client` queued tasks with their response rows and first events,
    in line as interleaved enqueues place them (client k's j-th task in round j),
    written by three set-based INSERTs: a volume set-up for query plans and
    `bench/fairness.py`, far faster than enqueueing 100,000 tasks one batch at a time.
    Without `analyze` the planner's statistics are left as they were, older than the
    backlog, as they are between two runs of autovacuum."""
    total = clients * per_client
    with db.write() as conn:
        now = db.clock.now_ms()
        conn.execute(text(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :last) "
            "INSERT INTO tasks (id, client_id, model, status, on_restart, attempts, "
            "max_attempts, created_at, updated_at, run_at, last_seq, dead_lettered, metadata, "
            "request, priority, vtime) "
            "SELECT 'resp_fill' || (10000000 + i), 'client-' || (i % :clients), :model, "
            "'queued', 'retry', 0, 3, :now, :now, :now, 1, 0, '{}', :request, 5, "
            "i / :clients FROM n"),
            {"last": total - 1, "clients": clients, "model": model, "now": now,
             "request": json.dumps({"model": model, "input": "words=1"})})
        filled = "FROM tasks WHERE id LIKE 'resp_fill%'"
        conn.execute(text("INSERT INTO responses (task_id, output_text, input_tokens, "
                          f"output_tokens, updated_at) SELECT id, '', 0, 0, :now {filled}"),
                     {"now": now})
        conn.execute(text("INSERT INTO task_events (task_id, seq, type, created_at, data) "
                          f"SELECT id, 1, 'response.created', :now, '{{}}' {filled}"),
                     {"now": now})
        if analyze:
            conn.execute(text("ANALYZE" if db.is_sqlite else "ANALYZE tasks"))


class Hearing:
    """A LISTEN handler for tests: every payload it heard, and `connected` set at each
    (re)connection (`PgListener` calls its handlers with an empty payload then)."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.connected = threading.Event()

    def __call__(self, payload: str) -> None:
        self.heard.append(payload)
        if payload == "":
            self.connected.set()
