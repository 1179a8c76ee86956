"""Sweeper step: retention cleanup, bounded per pass by time.

Old finished tasks (with events and responses), expired idempotency keys, pairing codes
and console sessions go in batches of at most `TASKWARD_RETENTION_BATCH_SIZE` rows for
at most a `PASS_SHARE` of the maintenance interval (`TASKWARD_SWEEP_SCHEDULE`: 15 s of
each minute by default). A time budget, not a batch count, so a pass removes as much as
the store manages in that time, and a backlog is worked off over the next passes
instead of holding up the rest of the maintenance loop; the rest of the interval is for
the other steps and (on SQLite) for the API's writers.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

from core.cron import next_slot, parse_cron
from core.settings import Settings
from core.store.database import Database
from core.store.retention import remove_expired

PASS_SHARE = 0.25


def clean(db: Database, settings: Settings, stop: threading.Event) -> dict[str, Any]:
    """One pass's cleanup; `stop` (the sweeper's graceful stop) ends it after the batch
    under way: a stop waits for the maintenance pass, and then drains its attempts
    within `TASKWARD_DRAIN_SECONDS`."""
    removed = remove_expired(db, retention_ms=int(settings.retention_hours * 3600 * 1000),
                             batch_size=settings.retention_batch_size,
                             budget_s=PASS_SHARE * _interval_s(settings, db.clock.now_ms()),
                             stop=stop)
    return asdict(removed)


def _interval_s(settings: Settings, now_ms: int) -> float:
    """The time between the maintenance slots around `now_ms` (slots of a cron need
    not be evenly spaced: the one that starts at the next slot)."""
    schedule = parse_cron(settings.sweep_schedule)
    following = next_slot(schedule, now_ms)
    return (next_slot(schedule, following) - following) / 1000
