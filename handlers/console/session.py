"""The console's browser session: its cookie, who it is, and what it may be used for.

The cookie holds a random session secret (`core.console_sessions`), never the admin
token. It is HttpOnly (no script reads it), SameSite=Strict (no other site's page makes
the browser send it) and Secure when the request came over TLS, to taskward or to a
proxy that says so (`_over_tls`). Console pages ask for
the session as a dependency; the API accepts the cookie only for what the console's own
pages fetch without a token: safe methods from a same-origin page, which the browser
marks with `Sec-Fetch-Site: same-origin` (the live tail's `EventSource`, which cannot
send an Authorization header). Everything that changes state goes through the
console's own forms, each checked for its CSRF token and its origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.di import NamedDependency

from core.clients import Client
from core.console_sessions import ConsoleSession
from core.errors import DomainError
from core.store.console_sessions import session_of
from core.store.database import Database
from handlers.services import Services
from handlers.threads import blocking

COOKIE = "taskward_console"
SAME_ORIGIN = "same-origin"
_SAFE_METHODS = frozenset({"GET", "HEAD"})
# What a console handler's `session` parameter is annotated with (provided by name).
Session = NamedDependency[ConsoleSession]


class LoginRequired(DomainError):
    """No live session: a console page answers with the login form instead."""

    status = 401

    def __init__(self) -> None:
        super().__init__("login_required", "log in to the console with an admin token")


class CsrfRefused(DomainError):
    """A console form came without this session's CSRF token, or from another origin."""

    status = 403

    def __init__(self) -> None:
        super().__init__("csrf_refused", "the form is stale or was not sent by this console; "
                                         "reload the page and try again")


def _read(db: Database, secret: str) -> ConsoleSession | None:
    return session_of(db, secret, db.clock.now_ms())


async def session_of_request(request: Request[Any, Any, Any], services: Services) -> ConsoleSession:
    """The dependency of every console page: the live session, or `LoginRequired`."""
    secret = request.cookies.get(COOKIE)
    session = await blocking(_read, services.db, secret) if secret else None
    if session is None:
        raise LoginRequired()
    return session


def _console_read(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The session secret of a console page's own API read, or None when this request is
    not one: a safe method, no Authorization header, marked same-origin by the browser."""
    if (connection.scope.get("method") not in _SAFE_METHODS
            or "authorization" in connection.headers
            or connection.headers.get("sec-fetch-site") != SAME_ORIGIN):
        return None
    return connection.cookies.get(COOKIE) or None


async def console_client(connection: ASGIConnection[Any, Any, Any, Any]) -> Client | None:
    """The admin behind a console page's own API read, or None when this request is not
    one (the caller then asks for a bearer token as usual)."""
    secret = _console_read(connection)
    if secret is None:
        return None
    session = await blocking(_read, connection.app.state.services.db, secret)
    return None if session is None else session.client


def session_still_valid(
    connection: ASGIConnection[Any, Any, Any, Any],
) -> Callable[[], Awaitable[bool]] | None:
    """For a console page's own API read: asks, later in a long answer (the live tail),
    whether its session still holds, so logging out or revoking ends the stream too.
    None for any other request."""
    secret = _console_read(connection)
    if secret is None:
        return None
    db = connection.app.state.services.db

    async def still_valid() -> bool:
        return await blocking(_read, db, secret) is not None

    return still_valid


def from_this_origin(request: Request[Any, Any, Any]) -> bool:
    """False when the browser says the request came from another site's page: a form
    posted from elsewhere (login CSRF included) is refused before anything is read.

    `Sec-Fetch-Site` is the browser's own word, which no page can forge: `same-origin`
    is trusted as it is, without comparing `Origin` with `Host`, because a reverse
    proxy may rewrite `Host` (nginx sends the upstream's by default) and the forms
    would then be refused for ever; `same-site` and `cross-site` are refused. Only a
    browser that sends no Fetch Metadata (or `none`) has its `Origin` compared with
    `Host`, by host only: behind a TLS-terminating proxy the page's origin is https
    while this process sees http, and the host alone tells another site apart.
    """
    site = request.headers.get("sec-fetch-site")
    if site == SAME_ORIGIN:
        return True
    if site is not None and site != "none":
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        return urlsplit(origin).netloc == request.headers.get("host")
    except ValueError:  # no browser's Origin ("http://[", a bracket unclosed): not ours
        return False


def _over_tls(request: Request[Any, Any, Any]) -> bool:
    """True when the browser reached us over TLS: the request's own scheme says so, or
    the TLS-terminating proxy in front does, with `X-Forwarded-Proto: https` (its first
    value: where proxies append, the one nearest the browser comes first). The header
    is trusted as it is: a client that forges it only keeps its own browser from
    sending the cookie over plain HTTP, which harms nobody."""
    if request.url.scheme == "https":
        return True
    forwarded = request.headers.get("x-forwarded-proto", "")
    return forwarded.split(",", 1)[0].strip().lower() == "https"


def session_cookie(request: Request[Any, Any, Any], secret: str, max_age_s: int) -> Cookie:
    return Cookie(key=COOKIE, value=secret, path="/", max_age=max_age_s, httponly=True,
                  samesite="strict", secure=_over_tls(request))


def cleared_cookie(request: Request[Any, Any, Any]) -> Cookie:
    return Cookie(key=COOKIE, value="", path="/", max_age=0, httponly=True, samesite="strict",
                  secure=_over_tls(request))
