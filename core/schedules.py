"""Schedules: recurring `POST /v1/responses` bodies, defined by their owners
(docs/http-api.md#schedules).

This module validates definitions; `core.store.schedules` keeps them and
`core.schedule_firing` turns their due slots into tasks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import Field, ValidationError
from sqlalchemy import Row

from core.bodies import StrictBody, field_path
from core.clock import iso
from core.cron import CronSpec, parse_cron
from core.errors import InvalidInput
from core.idempotency import IdempotencyClaim
from core.requests import ResponseRequest
from core.settings import Settings
from core.store.database import Database
from core.store.idempotency_records import key_record, record_keys, stored_answer
from core.store.schedules import add_schedule, change_schedule, insert_schedule, schedules_page

MAX_CATCH_UP = 100
MAX_PAGE = 100
# What a client needs to own schedules: the scope of creating their tasks itself.
SCOPE = "responses:create"


class _ScheduleBody(StrictBody):
    cron: str
    request: dict[str, Any]
    catch_up: int = Field(1, ge=1, le=MAX_CATCH_UP)


class _ScheduleChanges(StrictBody):
    cron: str | None = None
    catch_up: int | None = Field(None, ge=1, le=MAX_CATCH_UP)


def _validation_error(exc: ValidationError, prefix: str = "") -> InvalidInput:
    """A 422 naming the first offending field (`request.temperature`), never its value."""
    first = exc.errors(include_input=False)[0]
    field = field_path([prefix + ".".join(str(part) for part in first["loc"])])
    where = field or prefix.rstrip(".") or "body"
    return InvalidInput("validation_error", f"{where}: {first['msg']}", extra={"field": where})


def _refuse(field: str, message: str) -> InvalidInput:
    return InvalidInput("validation_error", f"{field}: {message}", extra={"field": field})


def _parse_request(body: Mapping[str, Any], settings: Settings) -> ResponseRequest:
    """A schedule's `request`: a `POST /v1/responses` body that can run unattended.

    `run_at` is refused because the slot decides when the task runs; `background: false`
    and `stream: true` because nobody is connected to wait for a scheduled task.
    """
    try:
        request = ResponseRequest.model_validate(dict(body))
    except ValidationError as exc:
        raise _validation_error(exc, "request.") from None
    if "run_at" in body:
        raise _refuse("request.run_at", "a schedule's slot decides when its task runs")
    if not request.background:
        raise _refuse("request.background", "scheduled tasks always run in the background")
    if request.stream:
        raise _refuse("request.stream", "nobody is connected to a scheduled task's stream")
    if request.max_attempts is not None and request.max_attempts > settings.max_attempts_cap:
        raise _refuse("request.max_attempts",
                      f"must be at most {settings.max_attempts_cap} (the configured cap)")
    return request


@dataclass(frozen=True)
class _Definition:
    """A valid body, as the store keeps it."""

    spec: CronSpec
    model: str
    request_json: str
    catch_up: int


class _KeyTaken(Exception):
    """Another creation holds the Idempotency-Key: roll back, then answer from its record."""


def _definition(body: Mapping[str, Any], settings: Settings) -> _Definition:
    try:
        parsed = _ScheduleBody.model_validate(dict(body))
    except ValidationError as exc:
        raise _validation_error(exc) from None
    spec = parse_cron(parsed.cron)
    request = _parse_request(parsed.request, settings)
    return _Definition(spec, request.model, request.stored_json(), parsed.catch_up)


def create_schedule(
    db: Database, settings: Settings, client_id: str, body: Mapping[str, Any]
) -> Row[Any]:
    """Validate and store a schedule owned by `client_id`; its first slot is after now."""
    new = _definition(body, settings)
    return insert_schedule(db, client_id, new.spec, model=new.model,
                           request_json=new.request_json, catch_up=new.catch_up)


@dataclass(frozen=True)
class Created:
    """The answer to `POST /v1/schedules`, as it is sent: a replay is byte-identical."""

    schedule_id: str
    body: bytes
    replayed: bool = False


def create_schedule_once(
    db: Database, settings: Settings, client_id: str, body: Mapping[str, Any],
    idempotency: IdempotencyClaim | None,
) -> Created:
    """`create_schedule`, answered as `POST /v1/responses` answers under an
    Idempotency-Key (docs/http-api.md#schedules): the answer is recorded in the
    transaction that stores the schedule, so a retried create never doubles every
    firing. The same key with the same request gets the recorded answer again (even
    if its model has gone since), with another request `idempotency_key_reused`;
    a refused creation records nothing."""
    try:
        new = _definition(body, settings)
        with db.write() as conn:
            now = db.clock.now_ms()
            row = add_schedule(conn, now, client_id, new.spec, model=new.model,
                               request_json=new.request_json, catch_up=new.catch_up)
            answer = msgspec.json.encode(schedule_object(row))
            if idempotency is not None and not record_keys(conn, [key_record(
                    client_id, idempotency, row.id, 201, answer, now,
                    int(settings.idempotency_ttl_hours * 3_600_000))]):
                raise _KeyTaken
            return Created(row.id, answer)
    except (_KeyTaken, InvalidInput) as refusal:
        if idempotency is None:
            raise
        stored = stored_answer(db, client_id, idempotency)
        if stored is not None:
            return Created(stored.created_id, stored.body, replayed=True)
        if isinstance(refusal, _KeyTaken):  # the record had expired and is gone now
            return create_schedule_once(db, settings, client_id, body, idempotency)
        raise


def update_schedule(
    db: Database, schedule_id: str, client_id: str | None, body: Mapping[str, Any]
) -> Row[Any]:
    """Change `cron` and/or `catch_up`. A new expression starts afresh from now:
    the checkpoint moves to now, so no slot of the past is replayed under either one.
    Values the schedule already holds are no change; with no change at all the
    schedule comes back as it was (`core.store.schedules.change_schedule`)."""
    try:
        changes = _ScheduleChanges.model_validate(dict(body))
    except ValidationError as exc:
        raise _validation_error(exc) from None
    spec = parse_cron(changes.cron) if changes.cron is not None else None
    return change_schedule(db, schedule_id, client_id, spec=spec, catch_up=changes.catch_up)


def list_schedules(
    db: Database, client_id: str | None, *, limit: int = 20, after: str | None = None
) -> tuple[list[Row[Any]], str | None]:
    """A page of schedules, newest first; the cursor is the last id of the page."""
    if not 1 <= limit <= MAX_PAGE:
        raise _refuse("limit", f"must be between 1 and {MAX_PAGE}")
    return schedules_page(db, client_id, limit=limit, after=after)


def schedule_object(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "schedule",
        "cron": row.cron,
        "request": json.loads(row.request_json),
        "catch_up": row.catch_up,
        "next_run_at": iso(row.next_slot_at),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "client_id": row.client_id,
    }
