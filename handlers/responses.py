"""Creating work and the OpenAI-compatible surface around it (docs/http-api.md).

`POST /v1/responses` persists the task (with its first event and the idempotency
record) in one transaction before answering. What follows depends on the request:
`202` at once (the default, or `Prefer: respond-async`); an SSE stream of the task's
events (`stream: true`); or, for `background: false`, a wait on the live tail of up to
`sync_timeout_seconds` for the finished object (`200`), else the unfinished one (`202`).

The other routes are what OpenAI's SDKs call on an existing response (its id is its
task's id): `retrieve` (the object, or with `?stream=true` its events as SSE),
`cancel` and `delete`. They answer as OpenAI does, so `OpenAI(base_url=…/v1)` works
unchanged; `/v1/tasks` keeps the stricter task semantics (409 on a finished task).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from litestar import Response, delete, get, post
from litestar.params import HeaderParameter, JSONBody, Parameter
from litestar.response import Stream

from core.clients import Client
from core.errors import Conflict, NotFound, TooManyRequests
from core.idempotency import IdempotencyClaim
from core.objects import deleted_object, response_object
from core.requests import ResponseRequest, new_task
from core.states import TERMINAL, Status
from core.store.births import NewTask
from core.store.idempotency_records import is_replay
from core.store.new_tasks import dedupe_holder
from core.store.tasks import cancel, delete_finished, get_response
from handlers.answers import json_bytes, task_location
from handlers.auth import ClientRequest, requires, token_still_valid
from handlers.live import settled
from handlers.params import TaskId
from handlers.services import Services
from handlers.sse import MAX_SEQ, LastEventId, event_stream, resume_point
from handlers.threads import blocking, writing
from handlers.waits import until_left

RESPONSES_PATH = "/v1/responses"
ONE_RESPONSE = f"{RESPONSES_PATH}/{{response_id:str}}"


def _respond_async(prefer: str | None) -> bool:
    """RFC 7240 `Prefer: respond-async`, among other preferences or not."""
    return prefer is not None and any(
        part.split(";")[0].strip().lower() == "respond-async" for part in prefer.split(",")
    )


async def _stream_slot(
    services: Services, client: Client, new: NewTask, claim: IdempotencyClaim | None
) -> Callable[[], None]:
    """The client's stream slot for this request. A request that creates nothing (it
    repeats an answered Idempotency-Key, or an active task holds its dedupe key) is
    never refused by `max_streams`; the store is asked only when the slot is refused."""
    try:
        return services.limits.hold_stream(client)
    except TooManyRequests:
        replay = claim is not None and await blocking(is_replay, services.db, client.id, claim)
        if not replay and (new.dedupe_key is None
                           or await blocking(dedupe_holder, services.db, new) is None):
            raise
        return services.limits.hold_stream(client, refuse=False)


@post(RESPONSES_PATH, opt=requires("responses:create"), status_code=202,
      tags=["responses"])
async def create_response(
    request: ClientRequest,
    data: JSONBody[ResponseRequest],
    services: Services,
    # No length bound here: `parse_key` refuses every bad key with one code.
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key")] = None,
    # No length bound: preferences it does not know are ignored (RFC 7240), however long.
    prefer: Annotated[str | None, HeaderParameter(name="Prefer")] = None,
) -> Response[Any] | Stream:
    """Create a task; `202` with `Location` and the response object (status `queued`)."""
    client, db, settings = request.user, services.db, services.settings
    new = new_task(data, client_id=client.id, settings=settings, now_ms=db.clock.now_ms(),
                   max_active=client.limits.effective(settings).max_active_tasks or 0)
    claim = None
    if idempotency_key is not None:
        claim = IdempotencyClaim.of(idempotency_key, "POST", RESPONSES_PATH,
                                    await request.json())
    answers_at_once = _respond_async(prefer) or (data.background and not data.stream)
    # A stream or a wait takes its slot before the task is stored: a refusal stores nothing.
    held = None if answers_at_once else await _stream_slot(services, client, new, claim)
    try:
        outcome = await services.enqueuer.enqueue(new, claim)
    except BaseException:
        if held is not None:
            held()
        raise
    if outcome.dedupe_hit:
        if held is not None:
            held()
        return json_bytes(outcome.body, 200, {"Dedupe-Hit": "true"})
    # A replay answers in the mode of the request it repeats (same body, so same mode):
    # the stored body when that answer was immediate, else the same wait or stream over
    # the same task, which gives the first answer again once the task has finished. A
    # task since gone (deleted, or removed by retention before its key expired) leaves
    # only the stored body, which the replay then answers in any mode.
    replayed = {"Idempotent-Replayed": "true"} if outcome.replayed else {}
    located = {**task_location(outcome.task_id), **replayed}
    if held is None:
        preference = {"Preference-Applied": "respond-async"} if _respond_async(prefer) else {}
        return json_bytes(outcome.body, outcome.status_code, {**located, **preference})
    try:
        if data.stream:
            return await event_stream(db, services.tail, outcome.task_id, client.id, 0,
                                      token_still_valid(request), held=held,
                                      born=outcome.born, headers=replayed)
        try:
            task = await until_left(request.receive, token_still_valid(request), settled(
                db, services.tail, outcome.task_id, client.id, settings.sync_timeout_seconds,
                read=get_response))
        finally:
            held()
    except NotFound:  # the task is gone
        return json_bytes(outcome.body, outcome.status_code, located)
    if Status(task.status) in TERMINAL:
        return Response(response_object(task, task), status_code=200, headers=replayed)
    return Response(response_object(task, task), status_code=202, headers=located)


@get(ONE_RESPONSE, opt=requires("tasks:read"), tags=["responses"])
async def show_response(
    request: ClientRequest,
    response_id: TaskId,
    services: Services,
    stream: Annotated[bool, Parameter(
        description="answer with the events as Server-Sent Events instead")] = False,
    starting_after: Annotated[int, Parameter(
        ge=0, le=MAX_SEQ,
        description="with `stream`: only the events after this sequence number")] = 0,
    last_event_id: LastEventId = None,
) -> Response[Any] | Stream:
    """The stored response object; with `?stream=true`, its events after
    `starting_after` (or `Last-Event-ID`) as SSE, live ones following, closed after the
    terminal event. The query parameter decides, not `Accept`: OpenAI's SDK sends
    `Accept: application/json` when it streams."""
    owner = request.user.owner_filter
    if stream:
        return await event_stream(services.db, services.tail, response_id, owner,
                                  resume_point(starting_after, last_event_id),
                                  token_still_valid(request),
                                  held=services.limits.hold_stream(request.user))
    task = await blocking(get_response, services.db, response_id, owner)
    return Response(response_object(task, task))


@post(f"{ONE_RESPONSE}/cancel", opt=requires("tasks:cancel"), status_code=200,
      tags=["responses"])
async def cancel_response(
    request: ClientRequest, response_id: TaskId, services: Services
) -> dict[str, Any]:
    """Cancel as OpenAI does: `200` with the response object, whatever the state.

    A queued response is `cancelled` at once; a running one is `in_progress` until its
    worker stops (`cancelled` follows). One that had already finished comes back
    unchanged rather than as the `409` of `POST /v1/tasks/{id}/cancel`: OpenAI documents
    cancelling as idempotent, and its SDKs retry a 409.
    """
    try:
        outcome = await writing(services.db, cancel, services.db, response_id,
                                request.user.owner_filter)
        task = outcome.task
    except Conflict as finished:
        if finished.code != "task_already_finished":
            raise
        task = finished.extra["task"]
    return response_object(task, task)


@delete(ONE_RESPONSE, opt=requires("tasks:cancel"), status_code=200, tags=["responses"])
async def delete_response(
    request: ClientRequest, response_id: TaskId, services: Services
) -> dict[str, Any]:
    """Remove a finished response with its task and events: `200` with OpenAI's deletion
    object (the SDK's `responses.delete` reads no body, so any 2xx would do; the object
    tells other clients what happened). An active one is `409 task_not_finished`
    (`x-should-retry: false`): cancel it first.

    Scope `tasks:cancel`, like cancelling: both decide the fate of work that exists,
    while `responses:create` only adds work, so a client that may only submit cannot
    erase results.
    """
    await writing(services.db, delete_finished, services.db, response_id,
                  request.user.owner_filter)
    return deleted_object(response_id)


ROUTES = [create_response, show_response, cancel_response, delete_response]
