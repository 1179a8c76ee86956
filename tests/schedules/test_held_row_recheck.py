"""A due schedule whose row another sweeper held when this one's pass came to it, and
whose holder then fired nothing (it died in the middle of its chunk: here a
transaction that holds the row and rolls back), is fired in the same pass once the row
is free. Before, the pass passed it over for good; with `catch_up` 1 the next pass
fired only its own slot, and the slot was lost while a sweeper was up the whole time.
PostgreSQL only: SQLite's writer waits for the whole database instead of passing rows
over."""

from __future__ import annotations

import threading

import pytest
from freezegun import freeze_time
from sqlalchemy import select

from core.settings import Settings
from core.store.database import Database
from core.tables import schedules
from scheduler.fire_schedules import fire_due
from tests.schedules.helpers import create_at, fired

HELD_SECONDS = 1.0


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_slot_whose_row_a_dead_sweeper_held_is_fired_in_the_same_pass(
    db: Database, settings: Settings, model_id: str
) -> None:
    schedule = create_at("2024-03-01T02:59:30Z", db, settings, model_id, "* * * * *")
    holding = threading.Event()

    def dead_sweepers_chunk() -> None:
        with db.engine.connect() as conn:
            conn.execute(select(schedules.c.id).where(schedules.c.id == schedule)
                         .with_for_update())
            holding.set()
            threading.Event().wait(HELD_SECONDS)
            conn.rollback()  # the session ends without firing anything

    holder = threading.Thread(target=dead_sweepers_chunk)
    holder.start()
    try:
        assert holding.wait(10)
        with freeze_time("2024-03-01T03:00:10Z"):
            fire_due(db, settings)
    finally:
        holder.join(10)
    assert fired(db, schedule) == ["2024-03-01T03:00:00.000Z"]
