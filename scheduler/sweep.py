"""One sweeper pass: the steps of docs/operations.md, in order, each bounded.

1. expired leases get their task's restart policy;
2. due and resumable tasks are claimed into free slots and executed;
3. `cancelling` tasks whose worker is gone are finalised;
4. due schedules fire;
5. retention cleanup.

Before step 1 every pass checks this node's clock against the store's
(`leases.check_clock`), as leases run out by it.

Every step is safe while other sweepers run (claims skip locked rows, every
transition is conditional), so `taskward sweep` may overlap a running loop. The loop
runs the same maintenance steps on its cron timer (`scheduler.timer`) and claims
continuously instead of step 2.
"""

from __future__ import annotations

import threading
from typing import Any

from core.settings import Settings
from core.store.database import Database
from scheduler import leases, retention
from scheduler.claiming import execute_due
from scheduler.fire_schedules import fire_due


def sweep_once(db: Database, settings: Settings, *, stop: threading.Event,
               hurry: threading.Event | None = None) -> dict[str, Any]:
    """Run one pass; the summary `taskward sweep --json` prints. `stop` ends its
    claiming and drains step 2's attempts, `hurry` cuts that drain short."""
    summary: dict[str, Any] = {"expired": _expire(db, settings)}
    summary.update(execute_due(db, settings, stop=stop, hurry=hurry))
    summary.update(_after_execution(db, settings, stop))
    return summary


def maintain(db: Database, settings: Settings, stop: threading.Event) -> dict[str, Any]:
    """The pass without step 2, for the loop's timer; `stop` cuts its retention short."""
    return {"expired": _expire(db, settings), **_after_execution(db, settings, stop)}


def _expire(db: Database, settings: Settings) -> dict[str, int]:
    """Step 1, once the clock it judges leases by is checked against the store's."""
    leases.check_clock(db, settings)
    return leases.expire(db)


def _after_execution(db: Database, settings: Settings,
                     stop: threading.Event) -> dict[str, Any]:
    return {
        "finalised": leases.finalise_cancels(db),
        "schedules_fired": fire_due(db, settings, stop),
        "retention": retention.clean(db, settings, stop),
    }
