"""Schedules over HTTP (docs/http-api.md#schedules), under the `responses:create` scope.

A client sees and changes only its own schedules (another client's id is 404); `admin`
sees all. Bodies are validated by `core.schedules`, the same code the CLI goes
through, so both refuse the same input with the same `code` and field name. A create
takes an `Idempotency-Key` as `POST /v1/responses` does: a retry is answered, byte for
byte, from the record of the first answer.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Response, delete, get, patch, post
from litestar.params import Body, HeaderParameter

from core.idempotency import IdempotencyClaim
from core.schedules import (
    SCOPE,
    create_schedule_once,
    list_schedules,
    schedule_object,
    update_schedule,
)
from core.store.schedules import delete_schedule, get_schedule
from handlers.answers import json_bytes, page
from handlers.auth import ClientRequest, requires
from handlers.params import Cursor, PageLimit, ScheduleId
from handlers.services import Services
from handlers.threads import blocking

SCHEDULES_PATH = "/v1/schedules"
NewScheduleBody = Annotated[dict[str, Any], Body(
    description='`{"cron": "30 7 * * 1-5", "request": <POST /v1/responses body without '
                'run_at>, "catch_up": 1..100 (default 1)}`; cron is 5 fields, in UTC')]
ChangesBody = Annotated[dict[str, Any], Body(
    description='`{"cron"?, "catch_up"?}`; a new cron starts afresh from now')]


@post(SCHEDULES_PATH, opt=requires(SCOPE), status_code=201, tags=["schedules"])
async def schedule_create(
    request: ClientRequest, data: NewScheduleBody, services: Services,
    # No length bound here: `parse_key` refuses every bad key with one code.
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key")] = None,
) -> Response[Any]:
    """Create a schedule; its first slot is the first one after now. A repeated
    `Idempotency-Key` gets the first answer again (`Idempotent-Replayed: true`)."""
    claim = None if idempotency_key is None else IdempotencyClaim.of(
        idempotency_key, "POST", SCHEDULES_PATH, data)
    created = await blocking(create_schedule_once, services.db, services.settings,
                             request.user.id, data, claim)
    replayed = {"Idempotent-Replayed": "true"} if created.replayed else {}
    return json_bytes(created.body, 201,
                      {"Location": f"{SCHEDULES_PATH}/{created.schedule_id}", **replayed})


@get(SCHEDULES_PATH, opt=requires(SCOPE), tags=["schedules"])
async def schedules_list(
    request: ClientRequest, services: Services, limit: PageLimit = 20, after: Cursor = None
) -> dict[str, Any]:
    """Newest first; pass `next_cursor` back as `after` for the next page."""
    rows, cursor = await blocking(list_schedules, services.db, request.user.owner_filter,
                                  limit=limit, after=after)
    return page([schedule_object(row) for row in rows], cursor)


@get("/v1/schedules/{schedule_id:str}", opt=requires(SCOPE), tags=["schedules"])
async def schedule_show(
    request: ClientRequest, schedule_id: ScheduleId, services: Services
) -> dict[str, Any]:
    return schedule_object(
        await blocking(get_schedule, services.db, schedule_id, request.user.owner_filter))


@patch("/v1/schedules/{schedule_id:str}", opt=requires(SCOPE), tags=["schedules"])
async def schedule_change(
    request: ClientRequest, schedule_id: ScheduleId, data: ChangesBody, services: Services
) -> dict[str, Any]:
    """Change `cron` or `catch_up`; a new cron fires no slot from before the change. A
    body that changes nothing answers the schedule as it was (`updated_at` stays)."""
    return schedule_object(await blocking(
        update_schedule, services.db, schedule_id, request.user.owner_filter, data))


@delete("/v1/schedules/{schedule_id:str}", opt=requires(SCOPE), tags=["schedules"])
async def schedule_remove(
    request: ClientRequest, schedule_id: ScheduleId, services: Services
) -> None:
    """Stop future slots (204); tasks it already created are kept."""
    await blocking(delete_schedule, services.db, schedule_id, request.user.owner_filter)


ROUTES = [schedule_create, schedules_list, schedule_show, schedule_change, schedule_remove]
