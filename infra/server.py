"""Running the API under granian, programmatically.

granian starts `workers` processes; each imports `target` and, with `factory=True`,
calls it to build its own app (its own engine, pool and live tail), so nothing is
shared between workers but the database. Loopback is the default address: exposing
the API is a decision an operator makes with `--host`.
"""

from __future__ import annotations

from granian import Granian
from granian.constants import Interfaces, Loops

APP_FACTORY = "infra.app:serving_app"


def serve(
    target: str = APP_FACTORY,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    factory: bool = True,
) -> None:
    """Serve the ASGI app `target` ("module:attribute") until SIGINT or SIGTERM.

    The event loop is uvloop where installed (granian's `auto`), asyncio otherwise.
    """
    Granian(
        target,
        address=host,
        port=port,
        workers=workers,
        interface=Interfaces.ASGI,
        loop=Loops.auto,
        factory=factory,
        log_access=False,
    ).serve()
