"""`max_active_tasks`, exact across processes and machines (`core.quotas`).

The check runs in the transaction that inserts the tasks: the client's row is locked
first (PostgreSQL; SQLite's `BEGIN IMMEDIATE` already admits one writer), then its
active tasks are counted through `ix_tasks_client_active`. Two API processes enqueueing
for one client at the edge of its limit therefore take turns, and the second counts the
first one's committed tasks: the limit is never overshot. The count reads at most the
limit's worth of index entries, and a task that finishes frees its place by itself.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, func, select

from core.errors import TooManyRequests
from core.tables import IS_ACTIVE, clients, tasks

QUOTA_RETRY_SECONDS = 1.0  # active tasks free up as work finishes: ask again soon

_LOCK_CLIENT = (select(clients.c.id).where(clients.c.id == bindparam("p_client"))
                .with_for_update())
_ACTIVE = (select(func.count()).select_from(tasks)
           .where(IS_ACTIVE, tasks.c.client_id == bindparam("p_client")))


def room(conn: Connection, client_id: str, limit: int) -> int:
    """How many more tasks the client may have active now, under `limit` (> 0); the
    client's row stays locked until the transaction ends."""
    params = {"p_client": client_id}
    conn.execute(_LOCK_CLIENT, params)
    return max(0, limit - int(conn.execute(_ACTIVE, params).scalar_one()))


def quota_exceeded(limit: int) -> TooManyRequests:
    return TooManyRequests("quota_exceeded",
                           f"this client may have at most {limit} active tasks; "
                           "wait for some to finish", limit=limit,
                           retry_after=QUOTA_RETRY_SECONDS)
