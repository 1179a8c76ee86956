"""`/console`: the console's pages, forms and assets as one router.

The router is outside the bearer-token middleware (its pages ask for the session
cookie instead, `handlers.console.session`) and outside the OpenAPI document (it is a
user interface, not the API). Its failures are pages, not problem documents: no session
sends the browser to the login form, a domain error or a refused field is an error page
with its status and a message written by us (never the input it refused).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from litestar import Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.response import Redirect

from core.errors import DomainError
from handlers.auth import PUBLIC_ROUTE
from handlers.console import actions, assets, pages
from handlers.console.render import html
from handlers.console.session import LoginRequired, session_of_request


def _login_required(_request: Request[Any, Any, Any], _exc: LoginRequired) -> Response[Any]:
    return Redirect("/console/login", status_code=303)


def _domain_error(request: Request[Any, Any, Any], exc: DomainError) -> Response[Any]:
    return _error_page(request, exc.status, exc.code, exc.message)


def _refused_field(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    return _error_page(request, 422, "validation_error",
                       "a field of this request is not valid")


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    return _error_page(request, status, "http_error", HTTPStatus(status).phrase)


def _error_page(request: Request[Any, Any, Any], status: int, code: str,
                message: str) -> Response[Any]:
    on_login = request.url.path.startswith("/console/login")
    return html("error.html", status_code=status, session=None, page="login" if on_login else "",
                status=status, code=code, message=message)


def console_router() -> Router:
    return Router(
        path="/console",
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
