"""A sweeper process for the race test: fires schedules minute by simulated minute.

Each minute it waits at a barrier shared with its rival, so both fire the same slots
at the same moment, through their own engine and connections; with `settled`, it then
waits for the test to look at what that minute left (and, say, finish tasks).
"""

from __future__ import annotations

from multiprocessing.synchronize import Barrier
from pathlib import Path

from core.cron import MINUTE_MS
from core.schedule_firing import fire_due_schedules
from core.settings import Settings
from core.store.connect import open_database


def sweep_minutes(url: str, models_dir: Path, start_ms: int, minutes: int, barrier: Barrier,
                  chunk: int, settled: Barrier | None = None) -> None:
    settings = Settings(database_url=url, models_dir=models_dir)
    db = open_database(settings)
    try:
        for minute in range(1, minutes + 1):
            barrier.wait(timeout=60)
            fire_due_schedules(db, settings, start_ms + minute * MINUTE_MS + 1_000, chunk=chunk)
            if settled is not None:
                settled.wait(timeout=60)
    finally:
        db.dispose()
