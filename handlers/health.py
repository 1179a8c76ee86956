"""Liveness and readiness probes: open to everyone, cheap, no payloads."""

from __future__ import annotations

from litestar import get, head

from handlers.auth import PUBLIC_ROUTE
from handlers.services import Services
from handlers.threads import blocking


@get("/healthz", opt=PUBLIC_ROUTE, tags=["health"])
async def healthz() -> dict[str, str]:
    """The process answers; says nothing about the store."""
    return {"status": "ok"}


@get("/readyz", opt=PUBLIC_ROUTE, tags=["health"])
async def readyz(services: Services) -> dict[str, str]:
    """The store is reachable and its schema is the one this code needs (else 503)."""
    await blocking(services.readiness)
    return {"status": "ready"}


@head("/healthz", opt=PUBLIC_ROUTE, tags=["health"])
async def healthz_head() -> None:
    """`/healthz` for the load balancers that probe with HEAD (HTTP requires it of GET
    resources; without it they saw 405 and took a live process out of rotation)."""


@head("/readyz", opt=PUBLIC_ROUTE, tags=["health"])
async def readyz_head(services: Services) -> None:
    """`/readyz` for HEAD probes: 200, or the same 503 without its body."""
    await blocking(services.readiness)


ROUTES = [healthz, readyz, healthz_head, readyz_head]
