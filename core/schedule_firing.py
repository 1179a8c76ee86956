"""Firing due schedule slots: each slot yields at most one task, ever (SPEC 9).

One batch of due schedules (indexed on `next_slot_at`) is read, planned in memory, and
written in chunks, each chunk ONE transaction that:

1. claims the schedules with a conditional UPDATE: only rows whose `(checkpoint, cron)`
   are still what the plan was computed from move to `checkpoint = now` (PostgreSQL:
   `FOR UPDATE SKIP LOCKED`, so a racing sweeper passes over rows another one holds;
   SQLite: the write lock). A schedule edited, deleted or fired meanwhile is left alone.
   The same statement says whether each owner is revoked by now;
2. records each slot in the unique ledger with `INSERT … ON CONFLICT DO NOTHING`, so a
   slot fired before (whatever the checkpoint now says) creates nothing;
3. creates the tasks of the newly recorded slots through one `insert_tasks`, each due
   at its slot (its `run_at`, in the past by now: due at once).

Claim, ledger and tasks commit or vanish together: a crash between steps leaves the
schedule exactly as it was, and the next pass fires the slot once. The ledger keeps a
schedule's slots for the retention period (as long as their tasks may be kept), pruned
through its primary key as the schedule fires, so it stays bounded. A schedule whose
stored request no longer decodes, or whose model is gone, has its slots consumed
without tasks and a warning logged; it never blocks the others.

A schedule of a revoked client (SPEC 2: revoked clients are refused) fires nothing: its
slots are consumed without tasks (logged at debug level only, it is no fault), so its
checkpoint keeps moving and it never piles up as "due" in front of the others.
Clients are never un-revoked, so nothing is lost by consuming rather than keeping.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    String,
    any_,
    bindparam,
    delete,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql

from core.cron import due_slots, next_slot, parse_cron
from core.errors import DomainError
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.store.bulk import insert_rows, json_rows, rows_param
from core.store.database import Database
from core.store.new_tasks import NewTask, insert_tasks
from core.tables import clients, models, schedule_slots, schedules

log = logging.getLogger(__name__)

# Schedules per transaction: large enough to amortise the claim and ledger statements,
# small enough that SQLite's write lock is held for milliseconds (bench/schedules.py).
CHUNK = 200
# A stored row that no longer parses cannot say when it is next due; look again later.
_UNREADABLE_RETRY_MS = 24 * 3600 * 1000
# Why a claimed schedule's slots pass without tasks, when that is no fault to warn about.
_CLIENT_REVOKED = "client_revoked"


@dataclass(frozen=True)
class FireResult:
    examined: int  # due schedules read
    claimed: int  # of those, advanced by this call (others were taken or changed)
    created: int  # tasks created


@dataclass(frozen=True)
class _Plan:
    schedule_id: str
    checkpoint: int  # as read: the claim only succeeds if it is unchanged
    cron: str
    next_slot_at: int
    slots: tuple[int, ...]
    task: NewTask | None  # None: consume the slots without tasks, for `problem`
    problem: str | None = None


class _Calendar:
    """Slot arithmetic memoised for one pass.

    Slots depend only on (cron, catch_up, now), so 10,000 schedules sharing a few
    expressions cost a few calendar walks. Each group is walked back from now to the
    oldest checkpoint in it; filtering that window by a schedule's own checkpoint gives
    exactly `due_slots` for that schedule (its due slots are the newest of the window).
    """

    def __init__(self, rows: Sequence[Row[Any]], now: int) -> None:
        self.now = now
        self._floor: dict[tuple[str, int], int] = {}
        for row in rows:
            key = (row.cron, row.catch_up)
            self._floor[key] = min(self._floor.get(key, row.checkpoint), row.checkpoint)
        self.spec = cache(parse_cron)
        self._window = cache(self._walk_back)
        self.next_after_now = cache(lambda cron: next_slot(self.spec(cron), now))

    def _walk_back(self, cron: str, catch_up: int) -> tuple[int, ...]:
        return tuple(due_slots(self.spec(cron), self._floor[cron, catch_up], self.now, catch_up))

    def due(self, row: Row[Any]) -> tuple[int, ...]:
        return tuple(s for s in self._window(row.cron, row.catch_up) if s > row.checkpoint)


def fire_due_schedules(
    db: Database, settings: Settings, now: int, *, limit: int = 1000, chunk: int | None = None
) -> FireResult:
    """Fire the slots of up to `limit` schedules due at `now` (oldest due first),
    `chunk` (default `CHUNK`) schedules per transaction."""
    chunk = chunk or CHUNK
    with db.read() as conn:
        rows = list(conn.execute(
            select(schedules.c.id, schedules.c.client_id, schedules.c.cron,
                   schedules.c.request_json, schedules.c.catch_up, schedules.c.checkpoint)
            .where(schedules.c.next_slot_at <= now)
            .order_by(schedules.c.next_slot_at, schedules.c.id)
            .limit(limit)
        ))
        known_models = set(conn.execute(select(models.c.id)).scalars())
    calendar = _Calendar(rows, now)
    plans = sorted((_plan(row, calendar, known_models, settings) for row in rows),
                   key=lambda p: p.schedule_id)  # one lock order for every sweeper
    claimed = created = 0
    horizon = now - int(settings.retention_hours * 3_600_000)
    for start in range(0, len(plans), chunk):
        won, made = _write_isolating_failures(db, plans[start:start + chunk], now, horizon)
        claimed, created = claimed + won, created + made
    return FireResult(len(rows), claimed, created)


def _plan(row: Row[Any], calendar: _Calendar, known_models: set[str],
          settings: Settings) -> _Plan:
    try:
        plan = _Plan(row.id, row.checkpoint, row.cron, calendar.next_after_now(row.cron),
                     calendar.due(row), None)
    except DomainError as exc:  # written by another version, or by hand
        log.error("schedule %s: stored cron or catch_up is unreadable (%s); "
                  "looking again in a day", row.id, exc.code)
        return _Plan(row.id, row.checkpoint, row.cron, calendar.now + _UNREADABLE_RETRY_MS,
                     (), None, exc.code)
    try:
        request = ResponseRequest.model_validate_json(row.request_json)
    except ValidationError:
        return replace(plan, problem="invalid_request")
    if request.model not in known_models:
        return replace(plan, problem="model_not_found")
    return replace(plan, task=new_task(request, client_id=row.client_id, settings=settings,
                                       above_cap="clamp", schedule_id=row.id))


def _write_isolating_failures(
    db: Database, plans: Sequence[_Plan], now: int, horizon: int
) -> tuple[int, int]:
    """Write a chunk; if one schedule's task is refused (its model vanished after the
    plan was made), redo the chunk one schedule at a time and consume that one's slots."""
    try:
        return _write(db, plans, now, horizon)
    except DomainError as exc:
        if len(plans) > 1:
            results = [_write_isolating_failures(db, [plan], now, horizon) for plan in plans]
            return sum(r[0] for r in results), sum(r[1] for r in results)
        return _write(db, [replace(plans[0], task=None, problem=exc.code)], now, horizon)


def _write(db: Database, plans: Sequence[_Plan], now: int, horizon: int) -> tuple[int, int]:
    with db.write() as conn:
        claimed = claim_schedules(conn, plans, now)
        forget_slots(conn, claimed, before=horizon)
        won = [replace(p, task=None, problem=_CLIENT_REVOKED) if claimed[p.schedule_id] else p
               for p in plans if p.schedule_id in claimed]
        for plan in won:
            if plan.task is None and plan.slots:
                log.log(logging.DEBUG if plan.problem == _CLIENT_REVOKED else logging.WARNING,
                        "schedule %s: %d slot(s) skipped, no task created: %s",
                        plan.schedule_id, len(plan.slots), plan.problem)
        firing = {(p.schedule_id, s): p.task for p in won if p.task for s in p.slots}
        recorded = sorted(record_slots(db, conn, firing, now))
        created = insert_tasks(db, conn, [replace(firing[key], run_at=key[1])
                                          for key in recorded], now)
        made = [(key, None if task is None else task.id)
                for key, task in zip(recorded, created, strict=True)]
        attach_tasks(conn, made)
        if any(task_id for _, task_id in made):
            db.announce_work(conn)
    return len(won), sum(1 for _, task_id in made if task_id)


# Uncorrelated on purpose: SQLite's RETURNING is rendered without table names, where
# a correlated `clients.id = schedules.client_id` would only resolve by luck.
_OWNER_REVOKED = schedules.c.client_id.in_(
    select(clients.c.id).where(clients.c.revoked_at.is_not(None)))


# PostgreSQL: lock the planned rows first, passing over those a racing sweeper holds.
# The ids go as an array, whose length the planner knows: it looks them up by key
# (joined to a JSON table, which it guesses at 100 rows, it scanned the whole table).
_PLANNED_IDS = bindparam("ids", type_=postgresql.ARRAY(String()))
_LOCK_PLANNED = (select(schedules.c.id).where(schedules.c.id == any_(_PLANNED_IDS))
                 .with_for_update(skip_locked=True))


@cache
def _claim_statement(dialect_name: str) -> Any:
    """The UPDATE of `claim_schedules`, built once per dialect: the plans travel as one
    JSON parameter, so its text is the same for every chunk (`core.store.bulk`)."""
    plan = json_rows(dialect_name, "plan", [("id", String()), ("checkpoint", BigInteger()),
                                            ("cron", String()), ("next_slot_at", BigInteger())])
    as_planned = [schedules.c.id == plan.c.id, schedules.c.checkpoint == plan.c.checkpoint,
                  schedules.c.cron == plan.c.cron]
    if dialect_name == "postgresql":  # only the rows `_LOCK_PLANNED` got
        as_planned.append(schedules.c.id == any_(_PLANNED_IDS))
    return (
        update(schedules).where(*as_planned)
        .values(checkpoint=bindparam("now"), next_slot_at=plan.c.next_slot_at)
        .returning(schedules.c.id, _OWNER_REVOKED.label("revoked"))
    )


def claim_schedules(conn: Connection, plans: Sequence[_Plan], now: int) -> dict[str, bool]:
    """Advance the schedules still as planned. The ids returned are this caller's to
    fire, each with whether its owner is revoked: read in the transaction that creates
    the tasks, so a revocation committed before it is never missed. (SQLite needs no
    row locks: the write transaction holds the whole database.)"""
    ids = [p.schedule_id for p in plans]
    if conn.dialect.name == "postgresql":
        ids = list(conn.execute(_LOCK_PLANNED, {"ids": ids}).scalars())
    claimed = conn.execute(_claim_statement(conn.dialect.name), {
        "now": now, "ids": ids,
        "plan": rows_param([{"id": p.schedule_id, "checkpoint": p.checkpoint, "cron": p.cron,
                             "next_slot_at": p.next_slot_at} for p in plans])})
    return {row.id: bool(row.revoked) for row in claimed}


@cache
def _forget_statement(dialect_name: str) -> Any:
    fired = json_rows(dialect_name, "fired", [("id", String())])
    return delete(schedule_slots).where(schedule_slots.c.schedule_id.in_(select(fired.c.id)),
                                        schedule_slots.c.slot_at < bindparam("before"))


def forget_slots(conn: Connection, schedule_ids: Collection[str], *, before: int) -> None:
    """Drop these schedules' ledger rows for slots before `before` (by primary key).

    The horizon is the retention period, not the checkpoint: a row must outlive any
    checkpoint that could go back to its slot (a slow clock, an edit from another node).
    """
    if schedule_ids:
        conn.execute(_forget_statement(conn.dialect.name), {
            "before": before, "fired": rows_param([{"id": sid} for sid in schedule_ids])})


def record_slots(
    db: Database, conn: Connection, slots: Iterable[tuple[str, int]], now: int
) -> set[tuple[str, int]]:
    """Enter slots in the ledger; only the ones not there before come back.

    The task id is filled in by `attach_tasks` once the task exists, in this transaction.
    """
    rows = [{"schedule_id": sid, "slot_at": slot, "task_id": "", "created_at": now}
            for sid, slot in slots]
    if not rows:
        return set()
    inserted = insert_rows(conn, schedule_slots, rows, skip_conflicts=True,
                           returning=[schedule_slots.c.schedule_id, schedule_slots.c.slot_at])
    return {(row.schedule_id, row.slot_at) for row in inserted}


@cache
def _attach_statement(dialect_name: str) -> Any:
    fired = json_rows(dialect_name, "fired", [("sid", String()), ("slot", BigInteger()),
                                              ("tid", String())])
    return (update(schedule_slots)
            .where(schedule_slots.c.schedule_id == fired.c.sid,
                   schedule_slots.c.slot_at == fired.c.slot)
            .values(task_id=fired.c.tid))


def attach_tasks(conn: Connection, made: Sequence[tuple[tuple[str, int], str | None]]) -> None:
    """Point each ledger row at its task. A slot whose request hit an active task's
    dedupe key made no task: its ledger row goes."""
    fired = [{"sid": sid, "slot": slot, "tid": tid} for (sid, slot), tid in made if tid]
    if fired:
        conn.execute(_attach_statement(conn.dialect.name), {"fired": rows_param(fired)})
    deduped = [key for key, tid in made if tid is None]
    if deduped:
        conn.execute(delete(schedule_slots).where(
            tuple_(schedule_slots.c.schedule_id, schedule_slots.c.slot_at).in_(deduped)))
