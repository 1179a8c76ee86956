"""Creating work (SPEC 3.1) and reading the response object it builds.

`POST /v1/responses` persists the task (with its first event and the idempotency
record) in one transaction before answering. What follows depends on the request:
`202` at once (the default, or `Prefer: respond-async`); an SSE stream of the task's
events (`stream: true`); or, for `background: false`, a wait on the live tail of up to
`sync_timeout_seconds` for the finished object (`200`), else the unfinished one (`202`).
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.params import Parameter
from litestar.response import Stream

from core.errors import InvalidInput
from core.idempotency import IdempotencyClaim, parse_key, request_digest
from core.objects import response_object
from core.requests import ResponseRequest
from core.settings import Settings
from core.states import TERMINAL, Status
from core.store.tasks import NewTask
from handlers.answers import json_bytes, task_location
from handlers.auth import ClientRequest, requires
from handlers.live import read_task, settled
from handlers.params import TaskId
from handlers.services import Services
from handlers.sse import event_stream
from handlers.threads import blocking

RESPONSES_PATH = "/v1/responses"


def new_task(request: ResponseRequest, client_id: str, settings: Settings) -> NewTask:
    """The task a validated body asks for; `max_attempts` is held to the configured cap."""
    attempts = request.max_attempts or settings.max_attempts_default
    if attempts > settings.max_attempts_cap:
        raise InvalidInput("validation_error",
                           f"max_attempts: must be at most {settings.max_attempts_cap}",
                           extra={"field": "max_attempts"})
    run_at = int(request.run_at.timestamp() * 1000) if request.run_at is not None else None
    return NewTask(client_id=client_id, model=request.model, request_json=request.stored_json(),
                   on_restart=request.on_restart, max_attempts=attempts, run_at=run_at,
                   metadata=dict(request.metadata), dedupe_key=request.dedupe_key)


def _respond_async(prefer: str | None) -> bool:
    """RFC 7240 `Prefer: respond-async`, among other preferences or not."""
    return prefer is not None and any(
        part.split(";")[0].strip().lower() == "respond-async" for part in prefer.split(",")
    )


@post(RESPONSES_PATH, opt=requires("responses:create"), status_code=202,
      tags=["responses"])
async def create_response(
    request: ClientRequest,
    data: ResponseRequest,
    services: Services,
    idempotency_key: Annotated[str | None, Parameter(header="Idempotency-Key",
                                                     max_length=600)] = None,
    prefer: Annotated[str | None, Parameter(header="Prefer", max_length=200)] = None,
) -> Response[Any] | Stream:
    """Create a task; `202` with `Location` and the response object (status `queued`)."""
    client, db, settings = request.user, services.db, services.settings
    new = new_task(data, client.id, settings)
    claim = None
    if idempotency_key is not None:
        digest = request_digest("POST", RESPONSES_PATH, await request.json())
        claim = IdempotencyClaim(parse_key(idempotency_key), digest)
    outcome = await services.enqueuer.enqueue(new, claim)
    if outcome.replayed:
        return json_bytes(outcome.body, outcome.status_code,
                          {**task_location(outcome.task_id), "Idempotent-Replayed": "true"})
    if outcome.dedupe_hit:
        return json_bytes(outcome.body, 200, {"Dedupe-Hit": "true"})
    if _respond_async(prefer):
        return json_bytes(outcome.body, 202, {**task_location(outcome.task_id),
                                              "Preference-Applied": "respond-async"})
    if data.stream:
        return await event_stream(db, services.tail, outcome.task_id, client.id, after=0)
    if data.background:
        return json_bytes(outcome.body, 202, task_location(outcome.task_id))
    task = await settled(db, services.tail, outcome.task_id, client.id,
                         settings.sync_timeout_seconds)
    if Status(task.status) in TERMINAL:
        return Response(response_object(task, task), status_code=200)
    return Response(response_object(task, task), status_code=202,
                    headers=task_location(task.id))


@get(f"{RESPONSES_PATH}/{{response_id:str}}", opt=requires("tasks:read"),
     tags=["responses"])
async def show_response(
    request: ClientRequest, response_id: TaskId, services: Services
) -> dict[str, Any]:
    """The stored response object; its id is its task's id."""
    task = await blocking(read_task, services.db, response_id, request.user.owner_filter)
    return response_object(task, task)


ROUTES = [create_response, show_response]
