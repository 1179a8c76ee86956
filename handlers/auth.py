"""Who is calling, and may they: bearer tokens to clients, scopes to routes.

One middleware does both. It turns `Authorization: Bearer <token>` into a
`core.clients.Client` (401 when the token is missing, unknown or revoked) and refuses
a client without the scope its route names (403). A route names its scope with
`opt=requires("tasks:read")`; a route open to everyone with `opt=PUBLIC_ROUTE`.
Scopes are checked here rather than by Litestar guards because Litestar copies the
route handler for every guard call, which costs a sixth of a small request.

A console page's own reads (its live tail's `EventSource`, which cannot send a header)
are authenticated by the console session cookie instead (`handlers.console.session`).

It also spends one token of the client's request rate (`handlers.limits`). A request
the empty bucket would refuse still passes when it is a replay: the same
Idempotency-Key and the same request (method, path and body: the digest `enqueue`
compares) as one already answered. Only then is its body read here, and the store asked.

Tokens are checked through the process's `TokenCache`: a revocation is honoured at
once by the process that made it and within `poll_interval_ms` by every other. A long
answer, a stream or a wait (`handlers.waits`), asks again through `token_still_valid`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.enums import ScopeType
from litestar.exceptions import SerializationException
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from core.clients import Client
from core.errors import Forbidden, InvalidInput, TooManyRequests, Unauthorized
from core.idempotency import IdempotencyClaim
from core.store.database import Database
from core.store.idempotency_records import is_replay
from handlers.console.session import console_client, session_still_valid
from handlers.threads import blocking
from handlers.tokens import TokenCache

ClientRequest = Request[Client, Any, Any]  # `request.user` is the authenticated client
_PUBLIC = "public"
_SCOPE = "scope"
PUBLIC_ROUTE: dict[str, Any] = {_PUBLIC: True}
_MAX_TOKEN_LENGTH = 512


def requires(scope: str) -> dict[str, Any]:
    """Route options admitting clients that hold `scope` (or `admin`)."""
    return {_SCOPE: scope}


def _unauthenticated(scope: Scope) -> bool:
    """The OpenAPI schema and CORS preflights (`OPTIONS`) ask for no token."""
    return scope.get("method") == "OPTIONS" or scope["path"].startswith("/schema")


class BearerAuthentication(ASGIMiddleware):
    """An ASGI middleware rather than Litestar's authentication one, which hands its
    check a connection that cannot read the body a replay is told by."""

    scopes = (ScopeType.HTTP, ScopeType.WEBSOCKET)
    exclude_opt_key = _PUBLIC
    should_bypass_for_scope = staticmethod(_unauthenticated)

    async def handle(self, scope: Scope, receive: Receive, send: Send,
                     next_app: ASGIApp) -> None:
        connection: ASGIConnection[Any, Any, Any, Any] = ASGIConnection(scope, receive)
        scope["user"] = await _admitted(connection)
        await next_app(scope, receive, send)


async def _admitted(connection: ASGIConnection[Any, Any, Any, Any]) -> Client:
    """The caller, allowed on this route and within its request rate."""
    client = await _caller(connection)
    scope = connection.route_handler.opt.get(_SCOPE)
    if scope is not None and not client.allows(scope):
        raise Forbidden("missing_scope", f"this call needs the {scope} scope")
    services = connection.app.state.services
    try:
        services.limits.admit_request(client)
    except TooManyRequests:
        if not await _repeats_an_answer(connection, client, services.db):
            raise
    return client


async def _caller(connection: ASGIConnection[Any, Any, Any, Any]) -> Client:
    """The client behind the console session or the bearer token, or `Unauthorized`."""
    client = await console_client(connection)
    if client is not None:
        return client
    tokens: TokenCache = connection.app.state.services.tokens
    return await tokens.client(bearer_token(connection.headers.get("authorization")))


def token_still_valid(request: ClientRequest) -> Callable[[], Awaitable[bool]]:
    """Asks, later in a long answer (a stream, a wait), whether the caller's token still holds:
    a revocation must end what the revoked client is still receiving."""
    console_check = session_still_valid(request)
    if console_check is not None:
        return console_check
    token = bearer_token(request.headers.get("authorization"))
    tokens: TokenCache = request.app.state.services.tokens

    async def still_valid() -> bool:
        try:
            await tokens.client(token)
        except Unauthorized:
            return False
        return True

    return still_valid


def revoked() -> Unauthorized:
    """The 401 of a token that does not hold (unknown or revoked), as every request of
    it gets: also what a wait answers once its client is revoked."""
    return Unauthorized("invalid_token", "the bearer token is unknown or revoked")


async def _repeats_an_answer(
    connection: ASGIConnection[Any, Any, Any, Any], client: Client, db: Database
) -> bool:
    """Whether the request is a replay (`core.store.idempotency_records.is_replay`):
    never refused by a limit, as it creates nothing. Asked only of a request the rate
    limit would refuse; its body is read here, and read again from memory by its route."""
    header = connection.headers.get("idempotency-key")
    if header is None:
        return False
    request = connection.route_handler.resolve_request_class()(connection.scope,
                                                               connection.receive)
    try:
        claim = IdempotencyClaim.of(header, request.method, request.scope["path"],
                                    await request.json())
    except (InvalidInput, SerializationException):  # not a key, not JSON: no replay
        return False
    return await blocking(is_replay, db, client.id, claim)


def bearer_token(header: str | None) -> str:
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing_token", "send `Authorization: Bearer <token>`")
    if len(token) > _MAX_TOKEN_LENGTH:
        raise revoked()
    return token


def bearer_auth() -> BearerAuthentication:
    return BearerAuthentication()
