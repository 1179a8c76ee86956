"""Schedules in the store (what a valid one is: `core.schedules`; firing them:
`core.schedule_firing` and `core.store.schedule_slots`).

Two columns carry the firing state: `checkpoint` (every slot at or before it has been
handled) and `next_slot_at` (the indexed column the sweeper scans: the first slot after
the checkpoint, or, while a slot waits for its owner's `max_active_tasks`, when the
sweeper looks again). A new or re-timed
schedule starts with `checkpoint = now`, read in its write transaction, so it never
fires a slot from before it existed or from its previous expression.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from core.cron import CronSpec, next_slot
from core.errors import InvalidInput, NotFound
from core.ids import sortable_id
from core.store.database import Database
from core.store.pages import newest_first
from core.tables import models, schedule_slots, schedules


def _visible(client_id: str | None) -> list[Any]:
    """The `WHERE` that keeps a client to its own schedules (None: an admin sees all)."""
    return [] if client_id is None else [schedules.c.client_id == client_id]


def _require_model(conn: Connection, model_id: str) -> None:
    if conn.execute(select(models.c.id).where(models.c.id == model_id)).first() is None:
        raise InvalidInput("model_not_found", "request.model: no model is registered under that id",
                           extra={"field": "request.model"})


def insert_schedule(
    db: Database, client_id: str, spec: CronSpec, *, model: str, request_json: str,
    catch_up: int,
) -> Row[Any]:
    """Store a schedule of `model` (which must be registered); its first slot is after now."""
    with db.write() as conn:
        return add_schedule(conn, db.clock.now_ms(), client_id, spec, model=model,
                            request_json=request_json, catch_up=catch_up)


def add_schedule(
    conn: Connection, now: int, client_id: str, spec: CronSpec, *, model: str,
    request_json: str, catch_up: int,
) -> Row[Any]:
    """`insert_schedule` in the caller's write transaction, `now` read in it: its first
    slot is after `now`."""
    _require_model(conn, model)
    schedule_id = sortable_id("sched", now)
    conn.execute(insert(schedules).values(
        id=schedule_id, client_id=client_id, cron=spec.expr,
        request_json=request_json, catch_up=catch_up, checkpoint=now,
        next_slot_at=next_slot(spec, now), created_at=now, updated_at=now,
    ))
    return _schedule_in(conn, schedule_id, client_id)


def change_schedule(
    db: Database, schedule_id: str, client_id: str | None, *, spec: CronSpec | None,
    catch_up: int | None,
) -> Row[Any]:
    """Change the expression and/or catch-up. A new expression starts afresh from now:
    the checkpoint moves to now, so no slot of the past is replayed under either one.
    A change to what the schedule already holds (None, the same catch-up, the same
    normalised expression) is no change: with none at all the row is not written and
    `updated_at` stays, so a client that re-sends its settings learns nothing moved."""
    with db.write() as conn:
        current = _schedule_in(conn, schedule_id, client_id)
        now = db.clock.now_ms()
        values: dict[str, Any] = {}
        if catch_up is not None and catch_up != current.catch_up:
            values["catch_up"] = catch_up
        if spec is not None and spec.expr != current.cron:
            values.update(cron=spec.expr, checkpoint=now, next_slot_at=next_slot(spec, now))
        if not values:
            return current
        conn.execute(update(schedules).where(schedules.c.id == schedule_id)
                     .values(**values, updated_at=now))
        return _schedule_in(conn, schedule_id, client_id)


def delete_schedule(db: Database, schedule_id: str, client_id: str | None) -> None:
    """Stop future slots. Tasks already created keep running and keep their schedule_id;
    a sweeper firing this schedule right now finds its conditional update gone and
    creates nothing. The ledger goes too: no slot of this id can come due again."""
    with db.write() as conn:
        gone = conn.execute(
            delete(schedules).where(schedules.c.id == schedule_id, *_visible(client_id))
        )
        if gone.rowcount == 0:
            raise NotFound("schedule_not_found", "no such schedule")
        conn.execute(delete(schedule_slots).where(schedule_slots.c.schedule_id == schedule_id))


def get_schedule(db: Database, schedule_id: str, client_id: str | None) -> Row[Any]:
    """The schedule; another client's is `NotFound`, as if it did not exist."""
    with db.read() as conn:
        return _schedule_in(conn, schedule_id, client_id)


def _schedule_in(conn: Connection, schedule_id: str, client_id: str | None) -> Row[Any]:
    row = conn.execute(
        select(schedules).where(schedules.c.id == schedule_id, *_visible(client_id))
    ).first()
    if row is None:
        raise NotFound("schedule_not_found", "no such schedule")
    return row


def schedules_page(
    db: Database, client_id: str | None, *, limit: int, after: str | None
) -> tuple[list[Row[Any]], str | None]:
    """A page of schedules, newest first; the cursor is the last id of the page."""
    query = select(schedules).where(*_visible(client_id))
    with db.read() as conn:
        return newest_first(conn, query, schedules.c.id, limit=limit, after=after)


def schedules_of_model(db: Database, model_id: str) -> int:
    """How many schedules' requests name `model_id`: what removing that model leaves
    firing nothing (each slot is skipped with a warning, `core.schedule_firing`). The
    model is read from the stored request, as firing reads it; a request that no longer
    decodes names no model."""
    with db.read() as conn:
        stored = conn.execute(select(schedules.c.request_json)).scalars()
        return sum(1 for request in stored if _model_of(request) == model_id)


def _model_of(request_json: str) -> object:
    try:
        return json.loads(request_json).get("model")
    except (ValueError, AttributeError):
        return None
