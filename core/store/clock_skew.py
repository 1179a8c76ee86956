"""How far this node's clock is from the PostgreSQL server's.

Every stored time comes from the node's own clock (`core.clock`), leases included, so
clocks that disagree move lease expiry (`scheduler.leases.check_clock` says what that
does and warns). The server's clock is the one every node shares, so it is the
reference. SQLite is one machine's store: one clock, nothing to compare.
"""

from __future__ import annotations

from sqlalchemy import text

from core.store.database import Database

# `clock_timestamp()`, not `now()`: the time of the read, not of the transaction's start.
_SERVER_NOW_MS = text("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")


def skew_ms(db: Database, *, within_ms: int) -> int | None:
    """This node's clock less the server's, in ms (positive: ahead), read at the middle
    of one round trip; None on SQLite, or when the round trip took longer than
    `within_ms` (a store that slow cannot say how far apart the clocks are)."""
    if db.is_sqlite:
        return None
    with db.read() as conn:
        sent = db.clock.now_ms()
        server = int(conn.execute(_SERVER_NOW_MS).scalar_one())
        received = db.clock.now_ms()
    if received - sent > within_ms:
        return None
    return (sent + received) // 2 - server
