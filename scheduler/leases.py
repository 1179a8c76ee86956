"""Sweeper steps for tasks whose worker is gone (docs/state-machine.md, docs/operations.md).

Expired leases get their task's restart policy (`fail` → `failed worker_lost`,
`retry` → `queued`, `resume` → claimable from its snapshot, `cancelling` →
`cancelled`). After execution, `cancelling` tasks nobody holds are finalised, so a
task cancelled while it waited to be resumed does not wait forever.

Leases run out by the clock of the node that looks, so before step 1 each pass checks
that clock against the store's (`check_clock`).
"""

from __future__ import annotations

import logging

from core.settings import Settings
from core.store.clock_skew import skew_ms
from core.store.database import Database
from core.store.recovery import expire_leases, finalise_orphaned_cancels

log = logging.getLogger(__name__)

# Synced clocks (chrony, NTP) agree within milliseconds; a second apart is a clock
# that is not synced.
SKEW_WARNING_MS = 1000


def check_clock(db: Database, settings: Settings) -> None:
    """Warn, at every pass while it lasts, when this node's clock is a second or more
    from the PostgreSQL server's. A node S seconds ahead sees every other node's leases
    run out S seconds early: once S reaches the lease less the heartbeat, it hands back
    or fails tasks whose workers are alive and renewing (their writes are then fenced
    off, and the work is done again). A node behind leaves a crashed worker's tasks
    waiting S seconds longer."""
    skew = skew_ms(db, within_ms=SKEW_WARNING_MS)
    if skew is None or abs(skew) < SKEW_WARNING_MS:
        return
    seconds = abs(skew) / 1000
    if skew < 0:
        log.warning("this node's clock is %.1f s behind the PostgreSQL server's: it sees "
                    "expired leases %.1f s late; sync its clock (chrony, NTP)",
                    seconds, seconds)
        return
    margin = settings.lease_seconds - settings.heartbeat_seconds
    log.warning("this node's clock is %.1f s ahead of the PostgreSQL server's: it sees "
                "other nodes' leases run out %.1f s early%s; sync its clock (chrony, NTP)",
                seconds, seconds,
                ", enough to take over tasks whose workers are alive (the lease less the "
                f"heartbeat is {margin:g} s)" if seconds >= margin else "")


def expire(db: Database) -> dict[str, int]:
    """Step 1: apply the restart policy to every expired lease; counts per new state."""
    return expire_leases(db)


def finalise_cancels(db: Database) -> int:
    """Step 3: `cancelling` tasks whose worker is gone → `cancelled`; how many."""
    return finalise_orphaned_cancels(db)
