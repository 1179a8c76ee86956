"""Pairing and client administration (docs/http-api.md, authentication and scopes)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import delete, get, patch, post
from litestar.params import JSONBody, Parameter
from pydantic import Field, StringConstraints

from core.bodies import NO_CONTROL, PUBLIC_BODY_BYTES, StrictBody
from core.clients import (
    DEFAULT_SCOPES,
    MAX_NAME_CHARS,
    SCOPES,
    client_object,
    pairing_code_object,
    parse_scopes,
    require_may_limit,
    require_within_own_limits,
)
from core.errors import Forbidden
from core.quotas import Limits
from core.settings import MAX_ACTIVE_TASKS_BOUND, MAX_STREAMS_BOUND, REQUESTS_PER_SECOND_BOUND
from core.store.clients import (
    clients_page,
    create_pairing_code,
    redeem_pairing_code,
    revoke,
    set_limits,
)
from core.store.pairing_codes import outstanding_codes, revoke_pairing_code
from handlers.answers import page
from handlers.auth import PUBLIC_ROUTE, ClientRequest, requires
from handlers.params import ClientId, Cursor, PageLimit
from handlers.services import Services
from handlers.threads import blocking

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS,
                                        pattern=NO_CONTROL)]
CodeId = Annotated[str, Parameter(description="a pairing code's id: the code's part before "
                                              "the `-`")]


class PairBody(StrictBody):
    code: str = Field(min_length=1, max_length=200)
    name: Name | None = None


class LimitsBody(StrictBody):
    """A client's limits (`core.quotas`); null: the setting's default."""

    max_active_tasks: int | None = Field(default=None, ge=0, le=MAX_ACTIVE_TASKS_BOUND,
                                         description="queued + running at once; 0 = unlimited")
    requests_per_second: float | None = Field(default=None, ge=0, le=REQUESTS_PER_SECOND_BOUND,
                                              description="per API process; 0 = unlimited")
    max_streams: int | None = Field(default=None, ge=1, le=MAX_STREAMS_BOUND,
                                    description="SSE streams and waits at once, per process")

    def limits(self) -> Limits:
        return Limits(self.max_active_tasks, self.requests_per_second, self.max_streams)


class PairingCodeBody(LimitsBody):
    scopes: list[str] = Field(default_factory=lambda: sorted(DEFAULT_SCOPES),
                              max_length=len(SCOPES),
                              description="scopes the new client gets: " + ", ".join(SCOPES))
    name: Name | None = None


@post("/v1/pair", opt=PUBLIC_ROUTE, status_code=201, tags=["clients"],
      request_max_body_size=PUBLIC_BODY_BYTES)
async def pair(data: JSONBody[PairBody], services: Services) -> dict[str, Any]:
    """Redeem a one-time pairing code for a new client and its token (shown once)."""
    issued = await blocking(redeem_pairing_code, services.db, data.code, data.name)
    return issued.public()


@post("/v1/pairing-codes", opt=requires("clients:admin"), status_code=201,
      tags=["clients"])
async def new_pairing_code(
    request: ClientRequest, services: Services, data: JSONBody[PairingCodeBody | None] = None
) -> dict[str, Any]:
    """A one-time pairing code; a client can only hand out scopes it holds itself, and
    without `admin` no limit looser than its own (the defaults count for a limit left
    out). Without a body (it is optional, docs/http-api.md): the default scopes, no
    name."""
    data = data or PairingCodeBody()
    scopes = parse_scopes(data.scopes)
    if not all(request.user.allows(scope) for scope in scopes):
        raise Forbidden("scope_not_held", "a client can only grant scopes it holds itself")
    require_within_own_limits(request.user, data.limits().columns(), services.settings)
    issued = await blocking(create_pairing_code, services.db, scopes=scopes, name=data.name,
                            ttl_seconds=services.settings.pairing_code_ttl_seconds,
                            limits=data.limits(), created_by=request.user.id)
    return issued.public()


@get("/v1/pairing-codes", opt=requires("clients:admin"), tags=["clients"])
async def pairing_codes_list(
    request: ClientRequest, services: Services, limit: PageLimit = 20, after: Cursor = None
) -> dict[str, Any]:
    """A page of the codes that would still redeem, newest first, never a secret: so
    a code pasted where it should not be can be found and revoked. A client without
    `admin` sees only the codes it made."""
    rows, cursor = await blocking(outstanding_codes, services.db,
                                  made_by=request.user.owner_filter, limit=limit, after=after)
    return page([pairing_code_object(row) for row in rows], cursor)


@delete("/v1/pairing-codes/{code_id:str}", opt=requires("clients:admin"), tags=["clients"])
async def revoke_code(request: ClientRequest, code_id: CodeId, services: Services) -> None:
    """Revoke an outstanding code (204): it no longer redeems. A client without `admin`
    may revoke only the codes it made; any other id is `404 pairing_code_not_found`."""
    await blocking(revoke_pairing_code, services.db, code_id, made_by=request.user.owner_filter)


@get("/v1/clients", opt=requires("clients:admin"), tags=["clients"])
async def clients_list(
    services: Services, limit: PageLimit = 20, after: Cursor = None
) -> dict[str, Any]:
    """A page of clients, newest first, as every list is: the whole table in one answer
    was megabytes once clients came and went by the thousand."""
    rows, cursor = await blocking(clients_page, services.db, limit=limit, after=after)
    return page([client_object(row) for row in rows], cursor)


@delete("/v1/clients/{client_id:str}", opt=requires("clients:admin"), tags=["clients"])
async def revoke_client(
    request: ClientRequest, client_id: ClientId, services: Services
) -> None:
    """Revoke a client (204): its token is refused from now on by this process, and by
    every other within `poll_interval_ms`. Only an `admin` may revoke an `admin`."""
    await blocking(revoke, services.db, client_id, by=request.user)
    services.tokens.forget()


@patch("/v1/clients/{client_id:str}", opt=requires("clients:admin"), tags=["clients"])
async def change_client_limits(
    request: ClientRequest, client_id: ClientId, data: JSONBody[LimitsBody], services: Services
) -> dict[str, Any]:
    """Change a client's limits: only the fields sent change (null: back to the
    default). Honoured by this process at once, by every other within
    `poll_interval_ms`. Only an `admin` may limit an `admin` client, or itself; without
    `admin`, no limit sent may be looser than the caller's own (one not sent is left
    as it is, even if looser). Limits sent as they already are change nothing: the
    client comes back as it is, and no other process re-reads its tokens."""
    require_may_limit(request.user, client_id)
    changes = data.model_dump(exclude_unset=True)
    require_within_own_limits(request.user, changes, services.settings)
    row = await blocking(set_limits, services.db, client_id, changes, by=request.user)
    services.tokens.forget()
    return client_object(row)


ROUTES = [pair, new_pairing_code, pairing_codes_list, revoke_code, clients_list, revoke_client,
          change_client_limits]
