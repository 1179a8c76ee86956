"""What the queue holds right now, for monitoring.

Read from the store, not counted in memory: every API process of every machine then
reports the same figures, and a restart loses none. Each count goes through a partial
index of `tasks` (the `IS_*` predicates), so a scrape costs the live tasks and the dead
letters, never the finished history.

Work waiting for a claim is not only `queued`: a `resume` task handed back (a graceful
stop, `taskward recover`, an upstream cool-down) stays `running` without a lease until a
claim continues it, and a task cancelled while nobody held it stays `cancelling` until a
sweeper pass finalises it. Both wait on sweepers exactly as a due queued task or an
expired lease does, so they are counted there: otherwise every sweeper could stay down
while the alerting figures read 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, case, func, select

from core.states import ACTIVE, Status
from core.store.database import Database
from core.tables import IS_ACTIVE, IS_DEAD_LETTER, IS_LEASED, IS_QUEUED, status_in, tasks


@dataclass(frozen=True)
class QueueStats:
    by_status: dict[Status, int]  # every active status, zero included
    due: int  # tasks a claim may take now: queued ones and handed-back `running` ones
    oldest_due_at: int | None  # since when the longest-waiting due task is claimable, ms
    expired_leases: int  # tasks a sweeper pass must take back: past their lease, or
    #                      `cancelling` with none (`recovery.finalise_orphaned_cancels`)
    dead_letters: int


_BY_STATUS = select(tasks.c.status, func.count()).where(IS_ACTIVE).group_by(tasks.c.status)
_DUE = select(func.count(), func.min(tasks.c.run_at)).where(
    IS_QUEUED, tasks.c.run_at <= bindparam("now"))
# A handed-back task became claimable at the later of its hand-back (the write that
# cleared its lease set `updated_at`) and its `run_at` (a cool-down's wait); the lease
# index finds it by its NULL lease.
_CLAIMABLE_SINCE = case((tasks.c.run_at > tasks.c.updated_at, tasks.c.run_at),
                        else_=tasks.c.updated_at)
_HANDED_BACK = select(func.count(), func.min(_CLAIMABLE_SINCE)).where(
    IS_LEASED, status_in(Status.RUNNING), tasks.c.lease_expires_at.is_(None),
    tasks.c.run_at <= bindparam("now"))
_EXPIRED = (select(func.count()).select_from(tasks)
            .where(IS_LEASED, tasks.c.lease_expires_at < bindparam("now")))
# Apart from `_EXPIRED`, not OR-ed into it: SQLite then read the whole lease index
# instead of searching two ranges of it.
_UNHELD_CANCELS = select(func.count()).select_from(tasks).where(
    IS_LEASED, status_in(Status.CANCELLING), tasks.c.lease_expires_at.is_(None))
_DEAD = select(func.count()).select_from(tasks).where(IS_DEAD_LETTER)


def queue_stats(db: Database, now: int) -> QueueStats:
    """The figures as of `now`, read in one snapshot."""
    with db.read() as conn:
        return _read(conn, now)


def _read(conn: Connection, now: int) -> QueueStats:
    counted = {Status(status): count for status, count in conn.execute(_BY_STATUS)}
    queued, oldest_queued = conn.execute(_DUE, {"now": now}).one()
    handed_back, oldest_handed_back = conn.execute(_HANDED_BACK, {"now": now}).one()
    since = [at for at in (oldest_queued, oldest_handed_back) if at is not None]
    return QueueStats(
        by_status={status: counted.get(status, 0) for status in sorted(ACTIVE)},
        due=queued + handed_back,
        oldest_due_at=min(since, default=None),
        expired_leases=(conn.execute(_EXPIRED, {"now": now}).scalar_one()
                        + conn.execute(_UNHELD_CANCELS).scalar_one()),
        dead_letters=conn.execute(_DEAD).scalar_one(),
    )
