"""What a process shares between requests, handed to handlers as ONE dependency.

One dependency rather than several on purpose: Litestar resolves a batch of sibling
dependencies in an anyio task group (three task spawns per request), which cost more
than the rest of a `GET /v1/tasks/{id}` together. The caller is not here: it is
`request.user`, set by the authentication middleware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from litestar.di import NamedDependency

from core.settings import Settings
from core.store.database import Database
from handlers.enqueuing import Enqueuer
from handlers.limits import ClientLimits
from handlers.live import LiveTail
from handlers.tokens import TokenCache


@dataclass(frozen=True)
class ProcessServices:
    db: Database
    settings: Settings
    tail: LiveTail
    enqueuer: Enqueuer
    tokens: TokenCache
    limits: ClientLimits
    readiness: Callable[[], None]  # raises unless the store is reachable and at head


# What a handler's `services` parameter is annotated with: marked as provided by name,
# since Litestar deprecates dependencies it has to infer (they stop working in 3.0).
Services = NamedDependency[ProcessServices]
