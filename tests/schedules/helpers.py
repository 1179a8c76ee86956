"""Builders shared by the schedule tests: times, schedules, callers, and what firing
left behind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from freezegun import freeze_time
from litestar.testing import TestClient
from sqlalchemy import func, select, update

from core.clock import iso
from core.schedules import create_schedule
from core.settings import Settings
from core.store.clients import create_client
from core.store.database import Database
from core.tables import IS_ACTIVE, schedule_slots, schedules, tasks
from scheduler.fire_schedules import fire_due


def ms(text: str) -> int:
    """Epoch ms of a UTC time written `2024-02-29T12:00`."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def add_schedule(
    db: Database, settings: Settings, model: str, cron: str, *,
    catch_up: int = 1, client: str = "client-a", **request: Any,
) -> str:
    body = {"cron": cron, "catch_up": catch_up,
            "request": {"model": model, "input": "words=2", **request}}
    return create_schedule(db, settings, client, body).id


def create_at(when: str, db: Database, settings: Settings, model: str, cron: str,
              **options: Any) -> str:
    with freeze_time(when):
        return add_schedule(db, settings, model, cron, **options)


def fire_at(when: str, db: Database, settings: Settings) -> int:
    with freeze_time(when):
        return fire_due(db, settings)


def fired(db: Database, schedule_id: str | None = None) -> list[str | None]:
    return [iso(slot) for slot in task_slots(db, schedule_id)]


def finish_all_tasks(db: Database) -> None:
    with db.write() as conn:
        conn.execute(update(tasks).values(status="completed", finished_at=1))


def active_tasks(db: Database, client_id: str) -> int:
    """Tasks of the client that count towards its `max_active_tasks`."""
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(tasks).where(
            IS_ACTIVE, tasks.c.client_id == client_id)).scalar_one())


def task_slots(db: Database, schedule_id: str | None = None) -> list[int]:
    """run_at of every task a schedule made, oldest first (all schedules when None)."""
    query = select(tasks.c.run_at).where(tasks.c.schedule_id.is_not(None))
    if schedule_id is not None:
        query = query.where(tasks.c.schedule_id == schedule_id)
    with db.read() as conn:
        return sorted(conn.execute(query).scalars())


def ledger(db: Database) -> list[tuple[str, int, str]]:
    with db.read() as conn:
        rows = conn.execute(select(schedule_slots.c.schedule_id, schedule_slots.c.slot_at,
                                   schedule_slots.c.task_id))
        return sorted((row.schedule_id, row.slot_at, row.task_id) for row in rows)


def schedule_row(db: Database, schedule_id: str) -> Any:
    with db.read() as conn:
        return conn.execute(select(schedules).where(schedules.c.id == schedule_id)).one()


def rewind_checkpoint(db: Database, schedule_id: str, checkpoint: int) -> None:
    """What a restored backup or a sweeper with a slow clock could leave behind."""
    with db.write() as conn:
        conn.execute(update(schedules).where(schedules.c.id == schedule_id)
                     .values(checkpoint=checkpoint, next_slot_at=checkpoint))


class Caller:
    """A TestClient speaking as one client (its bearer token on every request)."""

    def __init__(self, http: TestClient[Any], token: str, client_id: str) -> None:
        self.http, self.client_id = http, client_id
        self.headers = {"Authorization": f"Bearer {token}"}

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.http, method)
        return lambda *args, **kwargs: call(*args, headers=self.headers, **kwargs)


def caller(db: Database, http: TestClient[Any], *scopes: str) -> Caller:
    issued = create_client(db, name="test", scopes=frozenset(scopes))
    return Caller(http, issued.token, issued.client_id)
