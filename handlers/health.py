"""Liveness and readiness probes: open to everyone, cheap, no payloads."""

from __future__ import annotations

from litestar import get

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


ROUTES = [healthz, readyz]
