"""The sweeper step that fires due schedule slots (docs/operations.md, docs/http-api.md#schedules).

A pass reads due schedules in batches and stops when none are left or after
`MAX_BATCHES`, so one pass stays bounded however large the backlog; what remains is
due on the next pass, and each task still carries its slot as `run_at`.
"""

from __future__ import annotations

from core.schedule_firing import fire_due_schedules
from core.settings import Settings
from core.store.database import Database

BATCH = 1000
MAX_BATCHES = 50


def fire_due(db: Database, settings: Settings) -> int:
    """Fire every slot due now; returns the number of tasks created in this pass."""
    now = db.clock.now_ms()
    created = 0
    for _ in range(MAX_BATCHES):
        result = fire_due_schedules(db, settings, now, limit=BATCH)
        created += result.created
        # A short batch means nothing else is due; a batch of which nothing could be
        # claimed is held by another sweeper, which will finish it.
        if result.examined < BATCH or result.claimed == 0:
            break
    return created
