"""Slots fired in one pass each draw their own seed (docs/operations.md): a schedule's
request without `seed` must not give every caught-up slot the same sampling."""

from __future__ import annotations

import json

from sqlalchemy import select

from core.quotas import Limits
from core.settings import Settings
from core.store.clients import create_client, set_limits
from core.store.database import Database
from core.tables import tasks
from tests.schedules.helpers import create_at, finish_all_tasks, fire_at


def seeds(db: Database, schedule_id: str) -> list[int]:
    """The seed stored with each task of the schedule, oldest slot first."""
    with db.read() as conn:
        stored = conn.execute(select(tasks.c.request_json).where(
            tasks.c.schedule_id == schedule_id).order_by(tasks.c.run_at)).scalars()
        return [json.loads(request)["seed"] for request in stored]


def test_three_missed_slots_caught_up_together_get_three_seeds(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", catch_up=3)
    assert fire_at("2024-03-01T03:20:00Z", db, settings) == 3
    drawn = seeds(db, sid)
    assert len(drawn) == 3 and len(set(drawn)) == 3


def test_a_seed_the_request_fixes_is_kept_by_every_slot(
    db: Database, settings: Settings, model_id: str
) -> None:
    sid = create_at("2024-03-01T00:00:30Z", db, settings, model_id, "0 * * * *", catch_up=3,
                    seed=1234)
    assert fire_at("2024-03-01T03:20:00Z", db, settings) == 3
    assert seeds(db, sid) == [1234, 1234, 1234]


def test_slots_that_waited_on_the_quota_and_fire_together_get_their_own_seeds(
    db: Database, settings: Settings, model_id: str
) -> None:
    client = create_client(db, name="capped", scopes=frozenset({"responses:create"}),
                           limits=Limits(max_active_tasks=1)).client_id
    sid = create_at("2024-03-01T00:00:10Z", db, settings, model_id, "* * * * *",
                    catch_up=3, client=client)
    assert fire_at("2024-03-01T00:03:30Z", db, settings) == 1  # two slots wait
    finish_all_tasks(db)
    set_limits(db, client, {"max_active_tasks": 5})
    assert fire_at("2024-03-01T00:04:30Z", db, settings) == 3  # the waiting ones fire
    drawn = seeds(db, sid)
    assert len(drawn) == 4 and len(set(drawn)) == 4
