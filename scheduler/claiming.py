"""Sweeper step 2 for one pass: claim due and resumable work into the free slots and
run it to an outcome.

The pass keeps refilling slots as attempts finish, until nothing is due. It stops
taking new work once it has been claiming for one execution timeout, so a pass under a
steady stream of work still ends (each attempt is bounded by the same timeout). A stop
request (SIGTERM) ends claiming at once and drains like the loop does; a second one
(`hurry`) hands back what still runs at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from core.settings import Settings
from core.store.database import Database
from scheduler.attempt import Outcome
from scheduler.workers import Workers


def execute_due(db: Database, settings: Settings, *, stop: threading.Event,
                hurry: threading.Event | None = None) -> dict[str, Any]:
    """`{"claimed": n, <outcome>: n, …}` for every outcome of `Outcome`; `hurry` cuts
    the drain after `stop` short."""
    slot_freed = threading.Event()
    workers = Workers(db, settings, on_slot_freed=slot_freed.set)
    poll = settings.poll_interval_ms / 1000
    claim_until = time.monotonic() + settings.task_timeout_seconds
    try:
        while not stop.is_set() and time.monotonic() < claim_until:
            slot_freed.clear()
            workers.gather_slots()
            # Done when nothing ran before a claim that found nothing: checked after the
            # claim, attempts that ended meanwhile would hide that their kind was full.
            was_busy = workers.busy()
            started = workers.claim()
            if started == 0 and not was_busy:
                break
            if started == 0 or workers.free_slots() == 0:
                slot_freed.wait(poll)  # a freed slot, or the poll re-checks due work
        while workers.busy() and not stop.is_set():
            slot_freed.wait(poll)
            slot_freed.clear()
    finally:
        workers.stop(drain_seconds=settings.drain_seconds, hurry=hurry)
    return {"claimed": workers.claimed, **{o.value: workers.outcomes[o] for o in Outcome}}
