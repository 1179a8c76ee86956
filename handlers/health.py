"""Liveness and readiness probes: open to everyone, cheap, no payloads."""

from __future__ import annotations

from litestar import get
from sqlalchemy import text

from core.store.outage import TABLE_PRIVILEGES
from core.tables import clients, metadata, service_config
from handlers.auth import PUBLIC_ROUTE
from handlers.errors import problem
from handlers.heads import head_of
from handlers.services import ProcessServices, Services
from handlers.threads import blocking

# Whether this session takes writes (`transaction_read_only`: on for a hot standby and
# wherever `default_transaction_read_only` is, set on the role, the database or in the
# URL's `options`), and which privileges the role of TASKWARD_DATABASE_URL lacks on
# taskward's tables, as "UPDATE on tasks", in order. SELECT, INSERT and UPDATE are
# asked of every column taskward uses (`has_column_privilege` answers yes for the
# table's privilege too, so grants on the table and on all its columns both pass),
# DELETE of every table taskward deletes rows of. One statement, one round trip.
# The tables the service reads and writes: `service_config` only migrations touch.
_USED = [table for table in metadata.sorted_tables if table is not service_config]
_WRITE_OBSTACLES = text("""
SELECT current_setting('transaction_read_only') = 'on' AS read_only, ARRAY(
    SELECT privilege || ' on ' || table_name FROM (
        SELECT used.table_name, asked.privilege
        FROM unnest(CAST(:tables AS text[]), CAST(:columns AS text[]))
             AS used(table_name, column_name)
        CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE']) AS asked(privilege)
        WHERE NOT has_column_privilege(used.table_name, used.column_name, asked.privilege)
        UNION
        SELECT table_name, 'DELETE' FROM unnest(CAST(:deleted AS text[])) AS t(table_name)
        WHERE NOT has_table_privilege(table_name, 'DELETE')
    ) AS lacking ORDER BY table_name, privilege) AS lacking""").bindparams(
    tables=[table.name for table in _USED for _ in table.columns],
    columns=[column.name for table in _USED for column in table.columns],
    # Every table but those whose rows taskward never deletes (clients are revoked).
    deleted=[table.name for table in _USED if table is not clients])
_LACKING_NAMED = 3  # a role granted nothing lacks ~40: the detail names the first few


@get("/healthz", opt=PUBLIC_ROUTE, tags=["health"])
async def healthz() -> dict[str, str]:
    """The process answers; says nothing about the store."""
    return {"status": "ok"}


@get("/readyz", opt=PUBLIC_ROUTE, tags=["health"])
async def readyz(services: Services) -> dict[str, str]:
    """The store is reachable, its schema is the one this code needs and it takes this
    process's writes (else 503)."""
    await blocking(_ready, services)
    return {"status": "ready"}


def _ready(services: ProcessServices) -> None:
    """Raise unless this process can serve: `services.readiness` (the store answers, at
    this code's schema), and on PostgreSQL a session that takes writes and a role that
    may write every table taskward writes. A role granted SELECT alone, or only on the
    tasks table, or a read-only session (a standby, `default_transaction_read_only`)
    passed the rest, was put in rotation and answered writes `503 store_unavailable`; it
    is not ready, with the same code and what to change. One more statement per probe
    (SQLite has no privileges)."""
    services.readiness()
    if services.db.is_sqlite:
        return
    with services.db.read() as conn:
        read_only, lacking = conn.execute(_WRITE_OBSTACLES).one()
    refusals = []
    if read_only:
        refusals.append("the store takes no writes in this session (transaction_read_only "
                        "is on: a hot standby, or default_transaction_read_only set on the "
                        "role, the database or in the URL's options)")
    if lacking:
        more = len(lacking) - _LACKING_NAMED
        named = ", ".join(lacking[:_LACKING_NAMED]) + (f" and {more} more" if more > 0 else "")
        refusals.append(f"the role of TASKWARD_DATABASE_URL may not write taskward's tables "
                        f"(it lacks {named}): grant it {TABLE_PRIVILEGES} on them")
    if refusals:
        raise problem(503, "store_unavailable", "; ".join(refusals),
                      headers={"Retry-After": "1"})


# HEAD too, for the load balancers that probe with it (without it they saw 405 and took
# a live process out of rotation): `/readyz` answers 200, or the same 503 without a body.
ROUTES = [healthz, readyz, head_of(healthz), head_of(readyz)]
