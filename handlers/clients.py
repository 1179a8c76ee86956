"""Pairing and client administration (docs/http-api.md, authentication and scopes)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import delete, get, post
from litestar.params import JSONBody
from pydantic import Field, StringConstraints

from core.bodies import StrictBody
from core.clients import DEFAULT_SCOPES, SCOPES, client_object, parse_scopes
from core.errors import Forbidden
from core.store.clients import create_pairing_code, list_clients, redeem_pairing_code, revoke
from handlers.answers import page
from handlers.auth import PUBLIC_ROUTE, ClientRequest, requires
from handlers.params import ClientId
from handlers.services import Services
from handlers.threads import blocking

Name = Annotated[str, StringConstraints(min_length=1, max_length=200,
                                        pattern=r"^[^\x00-\x1f\x7f]+$")]


class PairBody(StrictBody):
    code: str = Field(min_length=1, max_length=200)
    name: Name | None = None


class PairingCodeBody(StrictBody):
    scopes: list[str] = Field(default_factory=lambda: sorted(DEFAULT_SCOPES),
                              max_length=len(SCOPES),
                              description="scopes the new client gets: " + ", ".join(SCOPES))
    name: Name | None = None


@post("/v1/pair", opt=PUBLIC_ROUTE, status_code=201, tags=["clients"])
async def pair(data: JSONBody[PairBody], services: Services) -> dict[str, Any]:
    """Redeem a one-time pairing code for a new client and its token (shown once)."""
    issued = await blocking(redeem_pairing_code, services.db, data.code, data.name)
    return issued.public()


@post("/v1/pairing-codes", opt=requires("clients:admin"), status_code=201,
      tags=["clients"])
async def new_pairing_code(
    request: ClientRequest, services: Services, data: JSONBody[PairingCodeBody | None] = None
) -> dict[str, Any]:
    """A one-time pairing code; a client can only hand out scopes it holds itself.
    Without a body (it is optional, docs/http-api.md): the default scopes, no name."""
    data = data or PairingCodeBody()
    scopes = parse_scopes(data.scopes)
    if not all(request.user.allows(scope) for scope in scopes):
        raise Forbidden("scope_not_held", "a client can only grant scopes it holds itself")
    issued = await blocking(create_pairing_code, services.db, scopes=scopes, name=data.name,
                            ttl_seconds=services.settings.pairing_code_ttl_seconds)
    return issued.public()


@get("/v1/clients", opt=requires("clients:admin"), tags=["clients"])
async def clients_list(services: Services) -> dict[str, Any]:
    rows = await blocking(list_clients, services.db)
    return page([client_object(row) for row in rows], None)


@delete("/v1/clients/{client_id:str}", opt=requires("clients:admin"), tags=["clients"])
async def revoke_client(
    request: ClientRequest, client_id: ClientId, services: Services
) -> None:
    """Revoke a client (204): its token is refused from now on by this process, and by
    every other within `poll_interval_ms`. Only an `admin` may revoke an `admin`."""
    await blocking(revoke, services.db, client_id, by=request.user)
    services.tokens.forget()


ROUTES = [pair, new_pairing_code, clients_list, revoke_client]
