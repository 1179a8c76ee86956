"""Sweeper step: retention cleanup, bounded per pass.

Old finished tasks (with events and responses), expired idempotency keys and pairing
codes go in batches of `TASKWARD_RETENTION_BATCH_SIZE`; a pass stops after
`MAX_BATCHES_PER_PASS` so a large backlog is worked off over several passes instead of
holding up the one that found it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from core.settings import Settings
from core.store.database import Database
from core.store.retention import remove_expired

MAX_BATCHES_PER_PASS = 50


def clean(db: Database, settings: Settings) -> dict[str, Any]:
    removed = remove_expired(db, retention_ms=int(settings.retention_hours * 3600 * 1000),
                             batch_size=settings.retention_batch_size,
                             max_batches=MAX_BATCHES_PER_PASS)
    return asdict(removed)
