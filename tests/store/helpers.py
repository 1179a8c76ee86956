"""Small builders shared by the store tests."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, update

from core.objects import TERMINAL_EVENTS
from core.states import OnRestart
from core.store.database import Database
from core.store.new_tasks import NewTask, enqueue
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
