"""An API path holding an encoded slash (`%2F`) is refused before it is routed.

The server percent-decodes the path before Litestar routes it, so an id that hides a
slash would reach another route: `GET /v1/tasks/resp_a%2Fcancel` was routed as
`/v1/tasks/resp_a/cancel` (a `405`), and `POST /v1/responses/<id>%2Fcancel` really
cancelled that task. No id of ours holds a `/`, so such an id names nothing and is
answered as one that names nothing is (`handlers.params.id_not_found`: `404` with its
collection's code), whichever route its decoded path would have reached; an encoded
slash elsewhere under `/v1` is a path no route has (`404 not_found`).

`/v1/models/` is left alone: a model id may hold `/` and its routes take the rest of
the path as the id, so there an encoded slash names the same model a plain one does.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.enums import ScopeType
from litestar.exceptions import NotFoundException
from litestar.types import ASGIApp, Receive, Scope, Send

from core.errors import NotFound
from handlers.errors import problem_of
from handlers.params import id_not_found

_API = b"/v1/"
_MODELS = b"models"
# The path parameter an id after `/v1/<collection>/` is given to.
_ID_OF_COLLECTION = {b"tasks": "task_id", b"responses": "response_id",
                     b"clients": "client_id", b"schedules": "schedule_id",
                     b"pairing-codes": "code_id"}


def refuse_encoded_slashes(app: ASGIApp) -> ASGIApp:
    """`app`, answering `404` itself for an API path whose raw form holds `%2F`."""

    async def refusing(scope: Scope, receive: Receive, send: Send) -> None:
        refusal = _refusal(scope.get("raw_path")) if scope["type"] == ScopeType.HTTP else None
        if refusal is None:
            await app(scope, receive, send)
            return
        request: Request[Any, Any, Any] = Request(scope, receive)
        response = problem_of(refusal).to_response(request)
        await response.to_asgi_response(app=None, request=request)(scope, receive, send)

    return refusing


def _refusal(raw_path: bytes | None) -> NotFound | NotFoundException | None:
    """The 404 for `raw_path`, or None when it holds no encoded slash under `/v1`."""
    if not raw_path or not raw_path.startswith(_API):
        return None
    path = raw_path.partition(b"?")[0]  # some servers keep the query here
    if b"%2f" not in path.lower():
        return None
    collection = path.removeprefix(_API).partition(b"/")[0]
    if collection == _MODELS:
        return None
    name = _ID_OF_COLLECTION.get(collection)
    return NotFoundException() if name is None else id_not_found(name)
