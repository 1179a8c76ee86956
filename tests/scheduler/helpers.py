"""Readers shared by the sweeper tests (the store's own builders live in tests/store)."""

from __future__ import annotations

import json
import threading
from typing import Any

from sqlalchemy import select

from core.settings import Settings
from core.store.births import NewTask, insert_task
from core.store.database import Database
from core.tables import responses
from scheduler.claiming import execute_due
from tests.store.helpers import events_of


def output_text(db: Database, task_id: str) -> str:
    with db.read() as conn:
        return str(conn.execute(
            select(responses.c.output_text).where(responses.c.task_id == task_id)).scalar_one())


def event_data(db: Database, task_id: str, event_type: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events_of(db, task_id) if e.type == event_type]


def streamed_text(db: Database, task_id: str) -> str:
    """What a client following the log has seen: every delta, in order."""
    return "".join(d["delta"] for d in event_data(db, task_id, "response.output_text.delta"))


def run_pass(db: Database, settings: Settings) -> dict[str, Any]:
    """Step 2 of a pass: claim and execute everything due."""
    return execute_due(db, settings, stop=threading.Event())


def enqueue_many(db: Database, model: str, count: int, *, input: str = "words=1") -> list[str]:
    """`count` tasks in one transaction (fast set-up for volume tests)."""
    request = json.dumps({"model": model, "input": input})
    with db.write() as conn:
        now = db.clock.now_ms()
        rows = [insert_task(db, conn, NewTask(client_id="client-a", model=model,
                                              request_json=request), now)
                for _ in range(count)]
        db.announce_work(conn)
    return [row.id for row in rows if row is not None]
