"""The sweeper step that fires due schedule slots (docs/operations.md, docs/http-api.md#schedules).

A pass reads due schedules in batches and stops when none are left or after
`MAX_BATCHES`, so one pass stays bounded however large the backlog; what remains is
due on the next pass, and each task still carries its slot as `run_at`.

A due schedule whose row another sweeper's transaction holds (PostgreSQL, `SKIP
LOCKED`) is passed over: a live sweeper fires it within its chunk. One that dies in
the middle of its chunk (kill -9, a dropped connection, a DBA's timeout) fires nothing,
and the next pass, a sweep interval later, would fire only its own slot where
`catch_up` is 1: the slot was lost while the service was up. So a pass that passed
rows over looks again shortly (`RECHECK_PAUSE_SECONDS`), for a bounded time: once the
holder's transaction has ended, they are either fired by it or free for this one.
"""

from __future__ import annotations

import threading

from core.schedule_firing import fire_due_schedules
from core.settings import Settings
from core.store.database import Database

BATCH = 1000
MAX_BATCHES = 50
RECHECK_PAUSE_SECONDS = 0.5
RECHECKS = 10  # 5 s in all: longer than any live sweeper's chunk of 200 schedules


def fire_due(db: Database, settings: Settings, stop: threading.Event | None = None) -> int:
    """Fire every slot due now; returns the number of tasks created in this pass.
    `stop` (the sweeper's graceful stop) ends its looks again."""
    now = db.clock.now_ms()
    created = 0
    rechecks = RECHECKS
    pause = stop or threading.Event()
    for _ in range(MAX_BATCHES):
        result = fire_due_schedules(db, settings, now, limit=BATCH)
        created += result.created
        if result.claimed == result.examined:  # none passed over
            if result.examined < BATCH:  # and nothing else is due
                break
            continue
        if rechecks == 0 or pause.wait(RECHECK_PAUSE_SECONDS):
            break
        rechecks -= 1
    return created
