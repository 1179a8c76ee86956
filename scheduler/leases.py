"""Sweeper steps for tasks whose worker is gone (docs/state-machine.md, docs/operations.md).

Expired leases get their task's restart policy (`fail` → `failed worker_lost`,
`retry` → `queued`, `resume` → claimable from its snapshot, `cancelling` →
`cancelled`). After execution, `cancelling` tasks nobody holds are finalised, so a
task cancelled while it waited to be resumed does not wait forever.
"""

from __future__ import annotations

from core.store.database import Database
from core.store.recovery import expire_leases, finalise_orphaned_cancels


def expire(db: Database) -> dict[str, int]:
    """Step 1: apply the restart policy to every expired lease; counts per new state."""
    return expire_leases(db)


def finalise_cancels(db: Database) -> int:
    """Step 3: `cancelling` tasks whose worker is gone → `cancelled`; how many."""
    return finalise_orphaned_cancels(db)
