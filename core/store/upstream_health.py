"""What sweepers saw of their upstreams, kept for `/metrics`: errors counted by code and
base URLs in cool-down, per upstream model, plus the attempts in flight.

Written by sweepers after attempts (a few rows, only when something failed), read by
any API process, so every scrape agrees whichever process serves it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select

from core.engines.upstream.routing import Reports
from core.store import capacity
from core.store.bulk import dialect_module
from core.store.database import Database
from core.tables import upstream_cooldowns, upstream_errors


@dataclass(frozen=True)
class UpstreamStats:
    in_flight: dict[str, int]  # every upstream model, zero included
    errors: dict[tuple[str, str], int]  # (model, code) → errors since the entry's first
    cooling: dict[str, list[str]]  # model → its base URLs in cool-down now


def record(db: Database, reports: Reports) -> None:
    """Add `reports` to the stored counters and cool-downs, in one transaction."""
    dialect = dialect_module("sqlite" if db.is_sqlite else "postgresql")
    with db.write() as conn:
        now = db.clock.now_ms()
        if reports.errors:
            insert = dialect.insert(upstream_errors)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[upstream_errors.c.model_id, upstream_errors.c.code],
                set_={"count": upstream_errors.c.count + insert.excluded.count,
                      "last_at": insert.excluded.last_at}),
                [{"model_id": m, "code": c, "count": n, "last_at": now}
                 for (m, c), n in sorted(reports.errors.items())])
        if reports.cooldowns:
            insert = dialect.insert(upstream_cooldowns)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[upstream_cooldowns.c.model_id, upstream_cooldowns.c.base_url],
                set_={"until": insert.excluded.until}),
                [{"model_id": m, "base_url": u, "until": until}
                 for (m, u), until in sorted(reports.cooldowns.items())])


_ERRORS = select(upstream_errors.c.model_id, upstream_errors.c.code,
                 upstream_errors.c.count.label("n"))  # `count` is a tuple method
_COOLING = (select(upstream_cooldowns.c.model_id, upstream_cooldowns.c.base_url)
            .where(upstream_cooldowns.c.until > bindparam("p_now"))
            .order_by(upstream_cooldowns.c.model_id, upstream_cooldowns.c.base_url))


def upstream_stats(db: Database, now: int) -> UpstreamStats:
    """The figures as of `now`, for the upstream models registered now, in one snapshot."""
    with db.read() as conn:
        return _read(conn, now)


def _read(conn: Connection, now: int) -> UpstreamStats:
    limits = capacity.upstream_limits(conn)
    counts = capacity.in_flight(conn, list(limits), now)
    cooling: dict[str, list[str]] = defaultdict(list)
    for row in conn.execute(_COOLING, {"p_now": now}):
        if row.model_id in limits:
            cooling[row.model_id].append(row.base_url)
    return UpstreamStats(
        in_flight={m: counts[m] for m in sorted(limits)},
        errors={(r.model_id, r.code): r.n for r in conn.execute(_ERRORS)
                if r.model_id in limits},
        cooling=dict(cooling),
    )
