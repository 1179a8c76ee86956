"""What the queue holds right now, for monitoring.

Read from the store, not counted in memory: every API process of every machine then
reports the same figures, and a restart loses none. Each count goes through a partial
index of `tasks` (the `IS_*` predicates), so a scrape costs the live tasks and the dead
letters, never the finished history.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, func, select

from core.states import ACTIVE, Status
from core.store.database import Database
from core.tables import IS_ACTIVE, IS_DEAD_LETTER, IS_LEASED, IS_QUEUED, tasks


@dataclass(frozen=True)
class QueueStats:
    by_status: dict[Status, int]  # every active status, zero included
    due: int  # queued tasks whose `run_at` has come
    oldest_due_at: int | None  # `run_at` of the longest-waiting due task, epoch ms
    expired_leases: int  # leased tasks past their lease that no sweeper has taken back
    dead_letters: int


_BY_STATUS = select(tasks.c.status, func.count()).where(IS_ACTIVE).group_by(tasks.c.status)
_DUE = select(func.count(), func.min(tasks.c.run_at)).where(
    IS_QUEUED, tasks.c.run_at <= bindparam("now"))
_EXPIRED = (select(func.count()).select_from(tasks)
            .where(IS_LEASED, tasks.c.lease_expires_at < bindparam("now")))
_DEAD = select(func.count()).select_from(tasks).where(IS_DEAD_LETTER)


def queue_stats(db: Database, now: int) -> QueueStats:
    """The figures as of `now`, read in one snapshot."""
    with db.read() as conn:
        return _read(conn, now)


def _read(conn: Connection, now: int) -> QueueStats:
    counted = {Status(status): count for status, count in conn.execute(_BY_STATUS)}
    due, oldest = conn.execute(_DUE, {"now": now}).one()
    return QueueStats(
        by_status={status: counted.get(status, 0) for status in sorted(ACTIVE)},
        due=due,
        oldest_due_at=oldest,
        expired_leases=conn.execute(_EXPIRED, {"now": now}).scalar_one(),
        dead_letters=conn.execute(_DEAD).scalar_one(),
    )
