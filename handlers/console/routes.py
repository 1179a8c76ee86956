"""`/console`: the console's pages, forms and assets as one router.

The router is outside the bearer-token middleware (its pages ask for the session
cookie instead, `handlers.console.session`) and outside the OpenAPI document (it is a
user interface, not the API). Its failures are pages, not problem documents, and carry
the pages' security headers: no session sends the browser to the login form; a domain
error, a refused field, a path the console does not have or a method its path does not
take (`405`, with `Allow`) is an error page with its status and a message written by
us (never the input it refused).

Litestar answers a path it cannot route, or a method the path does not take, with the
app's exception handlers before any router's run: `routing_failures` are those of the
app, which tell the console's paths from the API's.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from litestar import Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.response import Redirect
from litestar.types import ExceptionHandlersMap

from core.errors import DomainError
from handlers.auth import PUBLIC_ROUTE
from handlers.console import actions, assets, pages
from handlers.console.render import html
from handlers.console.session import LoginRequired, session_of_request
from handlers.errors import problem_of

PREFIX = "/console"


def _login_required(_request: Request[Any, Any, Any], _exc: LoginRequired) -> Response[Any]:
    return Redirect("/console/login", status_code=303)


def _domain_error(request: Request[Any, Any, Any], exc: DomainError) -> Response[Any]:
    return _error_page(request, exc.status, exc.code, exc.message)


def _refused_field(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    return _error_page(request, 422, "validation_error",
                       "a field of this request is not valid")


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    return _error_page(request, status, "http_error", HTTPStatus(status).phrase, exc.headers)


def _error_page(request: Request[Any, Any, Any], status: int, code: str, message: str,
                headers: dict[str, str] | None = None) -> Response[Any]:
    on_login = request.url.path.startswith("/console/login")
    return html("error.html", status_code=status, headers=headers, session=None,
                page="login" if on_login else "", status=status, code=code, message=message)


def _routing_failure(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    path = request.url.path
    if path == PREFIX or path.startswith(PREFIX + "/"):
        return _http_error(request, exc)
    return problem_of(exc).to_response(request)


def routing_failures() -> ExceptionHandlersMap:
    """The app's handlers of a path no route has (404) and a method its path does not
    take (405): a console page under `/console`, elsewhere the problem document that
    `handlers.errors` writes for every other failure."""
    return {NotFoundException: _routing_failure, MethodNotAllowedException: _routing_failure}


def console_router() -> Router:
    return Router(
        path=PREFIX,
        route_handlers=[*pages.ROUTES, *actions.ROUTES, *assets.ROUTES],
        dependencies={"session": Provide(session_of_request)},
        opt=PUBLIC_ROUTE,
        include_in_schema=False,
        exception_handlers={
            LoginRequired: _login_required,
            DomainError: _domain_error,
            ValidationException: _refused_field,
            HTTPException: _http_error,
        },
    )
