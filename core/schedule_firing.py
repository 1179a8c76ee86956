"""Firing due schedule slots: each slot yields at most one task, ever (docs/http-api.md#schedules).

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

A schedule of a revoked client (revoked clients are refused) fires nothing: its
slots are consumed without tasks (logged at debug level only, it is no fault), so its
checkpoint keeps moving and it never piles up as "due" in front of the others.
Clients are never un-revoked, so nothing is lost by consuming rather than keeping.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Row

from core.cron import due_slots, next_slot, parse_cron
from core.errors import DomainError
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.store.births import NewTask, insert_tasks
from core.store.database import Database
from core.store.schedule_slots import (
    attach_tasks,
    claim_schedules,
    due_schedules,
    forget_slots,
    record_slots,
)

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
    rows, known_models = due_schedules(db, now, limit)
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
        recorded = sorted(record_slots(conn, firing, now))
        created = insert_tasks(db, conn, [replace(firing[key], run_at=key[1])
                                          for key in recorded], now)
        made = [(key, None if task is None else task.id)
                for key, task in zip(recorded, created, strict=True)]
        attach_tasks(conn, made)
        if any(task_id for _, task_id in made):
            db.announce_work(conn)
    return len(won), sum(1 for _, task_id in made if task_id)
