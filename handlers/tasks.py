"""Tasks: pages, the status monitor with long-poll, cancellation and the event log.

A client sees only its own tasks (another client's id is 404); `admin` sees all.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.params import FromQuery, Parameter
from litestar.response import Stream

from core.objects import task_object
from core.priorities import HIGHEST_PRIORITY, LOWEST_PRIORITY
from core.states import Status
from core.store.tasks import CancelOutcome, cancel, list_tasks
from handlers.answers import page
from handlers.auth import ClientRequest, requires, token_still_valid
from handlers.params import Cursor, PageLimit, TaskId
from handlers.services import Services
from handlers.sse import (
    LastEventId,
    Seq,
    asks_for_event_stream,
    event_stream,
    read_events_page,
    resume_point,
)
from handlers.threads import blocking, writing
from handlers.waits import held_wait

MAX_WAIT_SECONDS = 60
MAX_EVENTS_PAGE = 1000


@get("/v1/tasks", opt=requires("tasks:read"), tags=["tasks"])
async def tasks_list(
    request: ClientRequest,
    services: Services,
    status: FromQuery[Status | None] = None,
    priority: Annotated[int | None, Parameter(ge=HIGHEST_PRIORITY, le=LOWEST_PRIORITY)] = None,
    limit: PageLimit = 20,
    after: Cursor = None,
) -> dict[str, Any]:
    """Newest first; pass `next_cursor` back as `after` for the next page."""
    rows, cursor = await blocking(list_tasks, services.db, request.user.owner_filter,
                                  status=status, priority=priority, limit=limit, after=after)
    return page([task_object(row) for row in rows], cursor)


@get("/v1/tasks/{task_id:str}", opt=requires("tasks:read"), tags=["tasks"])
async def task_show(
    request: ClientRequest,
    task_id: TaskId,
    services: Services,
    wait: Annotated[float, Parameter(ge=0, le=MAX_WAIT_SECONDS,
                                     description="seconds to wait for the task to finish")] = 0,
) -> dict[str, Any]:
    """The task; with `?wait=S` the answer waits until it is finished or S seconds pass."""
    return task_object(await held_wait(services, request, task_id, request.user.owner_filter,
                                       wait))


@post("/v1/tasks/{task_id:str}/cancel", opt=requires("tasks:cancel"), tags=["tasks"])
async def task_cancel(
    request: ClientRequest, task_id: TaskId, services: Services
) -> Response[Any]:
    """`queued` → `cancelled` (200); `loading`/`running` → `cancelling` (202);
    a finished task is 409 `task_already_finished`, with the task."""
    outcome: CancelOutcome = await writing(services.db, cancel, services.db, task_id,
                                           request.user.owner_filter)
    return Response(task_object(outcome.task), status_code=outcome.status_code)


@get("/v1/tasks/{task_id:str}/events", opt=requires("tasks:read"), tags=["tasks"])
async def task_events(
    request: ClientRequest,
    task_id: TaskId,
    services: Services,
    after: Seq = 0,
    limit: Annotated[int, Parameter(ge=1, le=MAX_EVENTS_PAGE)] = 100,
    last_event_id: LastEventId = None,
) -> Response[Any] | Stream:
    """`{data, next_after}` pages of events after `after`; with `Accept:
    text/event-stream`, the same events as SSE (resume with `Last-Event-ID` or `?after=`),
    live ones following, closed after the terminal event. A page ignores
    `Last-Event-ID`: only a stream resumes with it."""
    owner = request.user.owner_filter
    if asks_for_event_stream(request.headers.get("accept", "")):
        return await event_stream(services.db, services.tail, task_id, owner,
                                  resume_point(after, last_event_id),
                                  token_still_valid(request),
                                  held=services.limits.hold_stream(request.user))
    events = await blocking(read_events_page, services.db, task_id, owner, after, limit)
    return Response({"object": "list", "data": events.events,
                     "next_after": events.next_after(after)})


ROUTES = [tasks_list, task_show, task_cancel, task_events]
