"""Who is calling, and may they: bearer tokens to clients, scopes to routes.

One middleware does both. It turns `Authorization: Bearer <token>` into a
`core.clients.Client` (401 when the token is missing, unknown or revoked) and refuses
a client without the scope its route names (403). A route names its scope with
`opt=requires("tasks:read")`; a route open to everyone with `opt=PUBLIC_ROUTE`.
Scopes are checked here rather than by Litestar guards because Litestar copies the
route handler for every guard call, which costs a sixth of a small request.

A console page's own reads (its live tail's `EventSource`, which cannot send a header)
are authenticated by the console session cookie instead (`handlers.console.session`).

It also spends one token of the client's request rate (`handlers.limits`).

Tokens are checked through the process's `TokenCache`: a revocation is honoured at
once by the process that made it and within `poll_interval_ms` by every other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.middleware.base import DefineMiddleware

from core.clients import Client
from core.errors import Forbidden, InvalidInput, TooManyRequests, Unauthorized
from core.idempotency import parse_key
from core.store.database import Database
from core.store.new_tasks import is_recorded
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


class BearerAuthentication(AbstractAuthenticationMiddleware):
    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        client = await console_client(connection)
        if client is None:
            token = bearer_token(connection.headers.get("authorization"))
            tokens: TokenCache = connection.app.state.services.tokens
            client = await tokens.client(token)
        scope = connection.route_handler.opt.get(_SCOPE)
        if scope is not None and not client.allows(scope):
            raise Forbidden("missing_scope", f"this call needs the {scope} scope")
        services = connection.app.state.services
        try:
            services.limits.admit_request(client)
        except TooManyRequests:
            if not await _is_replay(connection, client, services.db):
                raise
        return AuthenticationResult(user=client, auth=None)


def token_still_valid(request: ClientRequest) -> Callable[[], Awaitable[bool]]:
    """Asks, later in a long answer (a stream), whether the caller's token still holds:
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


async def _is_replay(connection: ASGIConnection, client: Client, db: Database) -> bool:
    """A request that repeats an answered Idempotency-Key: never refused by a limit, as
    it creates nothing. Asked only of a request the rate limit would refuse."""
    key = connection.headers.get("idempotency-key")
    if key is None or connection.scope.get("method") != "POST":
        return False
    try:
        parsed = parse_key(key)
    except InvalidInput:
        return False
    return await blocking(is_recorded, db, client.id, parsed)


def bearer_token(header: str | None) -> str:
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing_token", "send `Authorization: Bearer <token>`")
    if len(token) > _MAX_TOKEN_LENGTH:
        raise Unauthorized("invalid_token", "the bearer token is unknown or revoked")
    return token


def bearer_auth() -> DefineMiddleware:
    return DefineMiddleware(BearerAuthentication, exclude=["^/schema"],
                            exclude_from_auth_key=_PUBLIC)
