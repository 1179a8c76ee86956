"""The Litestar application: routes, authentication, problem documents, the live tail.

`create_app` is the one place that wires the HTTP layer to the store it is handed
(`infra.app` opens it). Handlers keep no state between requests; what a process shares
(`ProcessServices`) is its database, its settings, the live-tail poller, the token
cache and the group-commit enqueuer.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from litestar import Litestar, Request, Router
from litestar.constants import OPENAPI_JSON_HANDLER_NAME
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import NotFoundException
from litestar.middleware.base import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins.pydantic import PydanticInitPlugin

from core.settings import Settings
from core.store.database import Database
from handlers import (
    clients,
    dead_letters,
    health,
    metrics,
    models,
    responses,
    schedules,
    tasks,
)
from handlers.arrivals import Arrivals
from handlers.auth import bearer_auth
from handlers.console.routes import console_router, routing_failures
from handlers.encoded_slashes import refuse_encoded_slashes
from handlers.enqueuing import Enqueuer
from handlers.errors import problem_details_plugin
from handlers.json_body import BoundedRequest
from handlers.limits import ClientLimits
from handlers.live import LiveTail
from handlers.options import answer_options_in_full
from handlers.params import before_handling
from handlers.services import ProcessServices
from handlers.slow_clients import bounded_body_reads
from handlers.threads import bound_waits
from handlers.tokens import TokenCache

LifespanHook = Callable[..., Any]


def create_app(
    settings: Settings,
    db: Database,
    *,
    readiness: Callable[[], None],
    on_startup: Sequence[LifespanHook] = (),
    on_shutdown: Sequence[LifespanHook] = (),
) -> Litestar:
    """The API over `db`, which it disposes of at shutdown; `readiness` raises unless
    the store is reachable and at the schema this code needs.

    `on_startup` hooks run after the store and the live tail are ready; `on_shutdown`
    hooks run before they close. Each hook may take the app as its one argument.
    """
    tail = LiveTail(db, interval_seconds=settings.poll_interval_ms / 1000)

    async def close() -> None:
        gc.unfreeze()  # what `settle_memory` hid may be garbage once the app is gone
        await tail.stop()
        await enqueuer.close()
        db.dispose()

    def settle_memory() -> None:
        """Hide what start-up built from the garbage collector until shutdown.

        Modules, route tables and SQLAlchemy's statement caches live as long as the
        app; a full collection would walk all of them again and again, pausing
        requests for tens of milliseconds (measured: POST p99 about 95 -> 55 ms).
        """
        gc.freeze()

    bound_waits(settings.store_wait_seconds)
    tokens = TokenCache(db, recheck_seconds=settings.poll_interval_ms / 1000)
    arrivals = Arrivals()
    enqueuer = Enqueuer(db, idempotency_ttl_ms=int(settings.idempotency_ttl_hours * 3_600_000),
                        arrivals=arrivals)
    services = ProcessServices(db=db, settings=settings, tail=tail, enqueuer=enqueuer,
                               tokens=tokens, limits=ClientLimits(settings),
                               readiness=readiness)

    app = Litestar(
        route_handlers=[*health.ROUTES, *metrics.ROUTES, *clients.ROUTES, *models.ROUTES,
                        *responses.ROUTES, *tasks.ROUTES, *dead_letters.ROUTES,
                        *schedules.ROUTES, console_router()],
        dependencies={"services": Provide(lambda: services, sync_to_thread=False,
                                          use_cache=True)},
        middleware=[DefineMiddleware(bounded_body_reads,
                                     body_timeout_seconds=settings.http_body_timeout_seconds,
                                     arrivals=arrivals),
                    bearer_auth()],
        request_class=BoundedRequest,
        before_request=before_handling,
        exception_handlers=routing_failures(),
        plugins=[problem_details_plugin(), _pydantic_bodies()],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=_openapi(),
        on_startup=[tail.start, *on_startup, settle_memory],
        on_shutdown=[*on_shutdown, close],
        state=State({"services": services}),
    )
    app.asgi_handler = answer_options_in_full(app)  # once every route is registered
    app.asgi_handler = refuse_encoded_slashes(app.asgi_handler)  # before routing
    return app


def _pydantic_bodies() -> PydanticInitPlugin:
    """Litestar validates a pydantic body with `strict=False` by default, which overrides
    the model's own config; `None` lets each model decide, so `core.bodies.StrictBody`'s
    strict JSON types hold (`"5"` is not an integer)."""
    return PydanticInitPlugin(validate_strict=None)  # type: ignore[arg-type]


def _openapi() -> OpenAPIConfig:
    try:
        release = version("taskward")
    except PackageNotFoundError:
        release = "0"
    return OpenAPIConfig(
        title="taskward",
        version=release,
        description="A durable asynchronous task service for model inference.",
        # The document alone, at `/schema` and `/schema/openapi.json`. Litestar's default
        # viewers (Redoc, Swagger UI, ...) are pages of this origin that load unpinned
        # scripts from public CDNs: such a script would act with an operator's console
        # session (read its CSRF token, post its forms), and the pages fetched from
        # elsewhere on an operator's private network.
        render_plugins=[JsonRenderPlugin(path=["/", "/openapi.json"])],
        openapi_router=Router("/schema", route_handlers=[], include_in_schema=False,
                              before_request=_document_only),
        security=[{"bearer": []}],
        components=Components(security_schemes={
            "bearer": SecurityScheme(type="http", scheme="bearer",
                                     description="a client token from `POST /v1/pair`"),
        }),
    )


async def _document_only(request: Request[Any, Any, Any]) -> None:
    """Under `/schema`, Litestar answers any other path with an HTML page of its own: it
    is the problem `404` every path nothing serves gets instead. (It takes the place of
    the app's `before_request`, whose checks these routes have nothing for.)"""
    if request.route_handler.name != OPENAPI_JSON_HANDLER_NAME:
        raise NotFoundException
