"""Liveness and readiness probes: open to everyone, cheap, no payloads."""

from __future__ import annotations

from litestar import get, head
from sqlalchemy import and_, func, select

from core.tables import tasks
from handlers.auth import PUBLIC_ROUTE
from handlers.errors import problem
from handlers.services import ProcessServices, Services
from handlers.threads import blocking

# Whether the role of TASKWARD_DATABASE_URL may write the tasks table, both privileges
# (`has_table_privilege` with a list answers whether ANY of them is held).
_MAY_WRITE = select(and_(func.has_table_privilege(tasks.name, "INSERT"),
                         func.has_table_privilege(tasks.name, "UPDATE")))


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


@head("/healthz", opt=PUBLIC_ROUTE, tags=["health"])
async def healthz_head() -> None:
    """`/healthz` for the load balancers that probe with HEAD (HTTP requires it of GET
    resources; without it they saw 405 and took a live process out of rotation)."""


@head("/readyz", opt=PUBLIC_ROUTE, tags=["health"])
async def readyz_head(services: Services) -> None:
    """`/readyz` for HEAD probes: 200, or the same 503 without its body."""
    await blocking(_ready, services)


def _ready(services: ProcessServices) -> None:
    """Raise unless this process can serve: `services.readiness` (the store answers, at
    this code's schema), and on PostgreSQL a role that may write the tasks table. A role
    granted SELECT alone passed the rest, was put in rotation and answered every write
    `503 store_unavailable`; it is not ready, with the same code and the GRANT to make.
    One more statement per probe (SQLite has no privileges)."""
    services.readiness()
    if services.db.is_sqlite:
        return
    with services.db.read() as conn:
        may_write = conn.execute(_MAY_WRITE).scalar_one()
    if not may_write:
        raise problem(503, "store_unavailable", "the role of TASKWARD_DATABASE_URL may not "
                      "write taskward's tables: grant it SELECT, INSERT, UPDATE, DELETE on "
                      "them", headers={"Retry-After": "1"})


ROUTES = [healthz, readyz, healthz_head, readyz_head]
