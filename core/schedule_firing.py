"""Firing due schedule slots: each slot yields at most one task, ever (docs/http-api.md#schedules).

One batch of due schedules (indexed on `next_slot_at`) is read, planned in memory, and
written in chunks, each chunk ONE transaction that:

1. takes the schedules whose `(checkpoint, cron)` are still what the plan was computed
   from (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so a racing sweeper passes over rows
   another one holds; SQLite: the write lock), reading whether each owner is revoked.
   A schedule edited, deleted or fired meanwhile is left alone;
2. counts the room each owner with a `max_active_tasks` has left, its client row locked
   as the API locks it (`core.store.active_quota`), and shares it out (below);
3. moves each schedule's checkpoint past the slots it handles, with a conditional UPDATE;
4. records each slot in the unique ledger with `INSERT … ON CONFLICT DO NOTHING`, so a
   slot fired before (whatever the checkpoint now says) creates nothing;
5. creates the tasks of the newly recorded slots through one `insert_tasks`, each due
   at its slot (its `run_at`, in the past by now: due at once). Each slot's task is made
   from the stored request on its own, so slots fired together (after downtime, or
   after waiting on the owner's quota) each draw their own seed, unless the request
   fixes one.

Claim, ledger and tasks commit or vanish together: a crash between steps leaves the
schedule exactly as it was, and the next pass fires the slot once. The ledger keeps a
schedule's slots for the retention period (as long as their tasks may be kept), pruned
through its primary key as the schedule fires, so it stays bounded. A schedule whose
stored request no longer decodes, or whose model is gone, has its slots consumed
without tasks and a warning logged; it never blocks the others. A slot whose request's
`dedupe_key` an active task of the owner holds makes no task either (it is passed, not
kept for later), logged at info level: that is what a dedupe key asks for.

A client's `max_active_tasks` holds for its schedules as for its requests: a slot that
would take the client over it waits. Its schedule's checkpoint stays before it, and the
schedule is looked at again at the next maintenance pass (`TASKWARD_SWEEP_SCHEDULE`,
its `next_slot_at`, so it never sorts ahead of the slots due by then and never
crowds out other clients'); once the client has room, its due slots fire, at most `catch_up` of
them as after downtime. The room is shared out oldest checkpoint first, so schedules of
one client take turns; two sweepers take turns on the client's row and the second
counts the first one's tasks. A schedule that starts waiting is logged once.

A schedule of a revoked client (revoked clients are refused) fires nothing: its
slots are consumed without tasks (logged at debug level only, it is no fault), so its
checkpoint keeps moving and it never piles up as "due" in front of the others.
Clients are never un-revoked, so nothing is lost by consuming rather than keeping.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Row

from core.clock import iso
from core.cron import due_slots, next_slot, parse_cron
from core.errors import DomainError
from core.quotas import Limits
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.store.active_quota import room
from core.store.births import NewTask, insert_tasks
from core.store.database import Database
from core.store.schedule_slots import (
    attach_tasks,
    claim_schedules,
    due_schedules,
    forget_slots,
    lock_as_planned,
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
class _Pass:
    """What every chunk of one call shares."""

    now: int
    horizon: int  # ledger rows of slots before it go (the retention period)
    next_look: int  # when a schedule held by its owner's quota is looked at again


@dataclass(frozen=True)
class _Plan:
    schedule_id: str
    client_id: str
    quota: int  # the owner's `max_active_tasks` as read (0: unlimited)
    checkpoint: int  # as read: the claim only succeeds if it is unchanged
    cron: str
    due_at: int  # `next_slot_at` as read
    checkpoint_to: int  # where the checkpoint moves: now, or before a slot that waits
    next_slot_at: int
    slots: tuple[int, ...]  # to fire (or consume, without `tasks`)
    tasks: tuple[NewTask, ...] | None  # one per slot, due at it; None: consume, for `problem`
    problem: str | None = None
    waiting: int = 0  # due slots left for a later look: the owner is at its quota

    @property
    def was_held(self) -> bool:
        """Whether a slot of it was already waiting for its owner's quota: then it was
        parked at a later look than its first slot after the checkpoint."""
        return next_slot(parse_cron(self.cron), self.checkpoint) < self.due_at


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
    this_pass = _Pass(now, horizon=now - int(settings.retention_hours * 3_600_000),
                      next_look=next_slot(parse_cron(settings.sweep_schedule), now))
    for start in range(0, len(plans), chunk):
        won, made = _write_isolating_failures(db, plans[start:start + chunk], this_pass)
        claimed, created = claimed + won, created + made
    return FireResult(len(rows), claimed, created)


def _plan(row: Row[Any], calendar: _Calendar, known_models: set[str],
          settings: Settings) -> _Plan:
    quota = Limits(max_active_tasks=row.max_active_tasks).effective(settings).max_active_tasks
    as_read = {"schedule_id": row.id, "client_id": row.client_id, "quota": quota or 0,
               "checkpoint": row.checkpoint, "cron": row.cron, "due_at": row.next_slot_at,
               "checkpoint_to": calendar.now}
    try:
        plan = _Plan(**as_read, next_slot_at=calendar.next_after_now(row.cron),
                     slots=calendar.due(row), tasks=None)
    except DomainError as exc:  # written by another version, or by hand
        log.error("schedule %s: stored cron or catch_up is unreadable (%s); "
                  "looking again in a day", row.id, exc.code)
        return _Plan(**as_read, next_slot_at=calendar.now + _UNREADABLE_RETRY_MS,
                     slots=(), tasks=None, problem=exc.code)
    try:
        request = ResponseRequest.model_validate_json(row.request_json)
    except ValidationError:
        return replace(plan, problem="invalid_request")
    if request.model not in known_models:
        return replace(plan, problem="model_not_found")
    return replace(plan, tasks=tuple(
        replace(new_task(request, client_id=row.client_id, settings=settings,
                         above_cap="clamp", schedule_id=row.id), run_at=slot)
        for slot in plan.slots))  # each its own `new_task`: each slot draws its own seed


def _write_isolating_failures(
    db: Database, plans: Sequence[_Plan], this_pass: _Pass
) -> tuple[int, int]:
    """Write a chunk; if one schedule's task is refused (its model vanished after the
    plan was made), redo the chunk one schedule at a time and consume that one's slots."""
    try:
        return _write(db, plans, this_pass)
    except DomainError as exc:
        if len(plans) > 1:
            results = [_write_isolating_failures(db, [plan], this_pass) for plan in plans]
            return sum(r[0] for r in results), sum(r[1] for r in results)
        return _write(db, [replace(plans[0], tasks=None, problem=exc.code)], this_pass)


def _write(db: Database, plans: Sequence[_Plan], this_pass: _Pass) -> tuple[int, int]:
    with db.write() as conn:
        owners = lock_as_planned(conn, plans)
        taken = [replace(p, tasks=None, problem=_CLIENT_REVOKED) if owners[p.schedule_id] else p
                 for p in plans if p.schedule_id in owners]
        rooms = _rooms(conn, {p.client_id: p.quota for p in taken if p.tasks})
        planned = _within_quotas(taken, rooms, this_pass.next_look)
        claimed = claim_schedules(conn, planned)
        forget_slots(conn, claimed, before=this_pass.horizon)
        won = [p for p in planned if p.schedule_id in claimed]
        _log_unfired(won)
        firing = {(p.schedule_id, s): task for p in won if p.tasks
                  for s, task in zip(p.slots, p.tasks, strict=True)}
        recorded = sorted(record_slots(conn, firing, this_pass.now))
        created = insert_tasks(db, conn, [firing[key] for key in recorded], this_pass.now)
        made = [(key, None if task is None else task.id)
                for key, task in zip(recorded, created, strict=True)]
        attach_tasks(conn, made)
        _log_deduped(key for key, task_id in made if task_id is None)
        if any(task_id for _, task_id in made):
            db.announce_work(conn)
    return len(won), sum(1 for _, task_id in made if task_id)


def _rooms(conn: Connection, quotas: dict[str, int]) -> dict[str, int]:
    """How many more active tasks each owner with a `max_active_tasks` may have (an
    owner without one, 0, is absent: unlimited); their client rows stay locked until
    the commit, taken in one order by every sweeper and API process. The limit is the
    one read with the plan, as an API process checks the one it read with the token."""
    return {client: room(conn, client, limit)
            for client, limit in sorted(quotas.items()) if limit}


def _within_quotas(plans: Sequence[_Plan], rooms: dict[str, int], next_look: int) -> list[_Plan]:
    """The plans with each owner's room shared out, oldest checkpoint first: the slots
    beyond it wait. A schedule with a slot waiting keeps its checkpoint before that slot
    and is looked at again at `next_look`."""
    left = dict(rooms)
    shared: dict[str, _Plan] = {}
    for plan in sorted(plans, key=lambda p: (p.checkpoint, p.schedule_id)):
        if plan.tasks is None or plan.client_id not in left:
            shared[plan.schedule_id] = plan
            continue
        fits = min(len(plan.slots), left[plan.client_id])
        left[plan.client_id] -= fits
        if fits < len(plan.slots):
            checkpoint_to = plan.slots[fits - 1] if fits else plan.checkpoint
            plan = replace(plan, slots=plan.slots[:fits], tasks=plan.tasks[:fits],
                           checkpoint_to=checkpoint_to,
                           next_slot_at=next_look, waiting=len(plan.slots) - fits)
        shared[plan.schedule_id] = plan
    return [shared[p.schedule_id] for p in plans]


def _log_deduped(slots: Iterable[tuple[str, int]]) -> None:
    """An info line for each slot that made no task because an active task of its
    owner holds the request's `dedupe_key`: meant (the previous run is still going),
    but an operator asking why a slot made nothing finds the answer in the log."""
    for schedule_id, slot in slots:
        log.info("schedule %s: slot %s skipped, no task created: an active task holds "
                 "its dedupe_key", schedule_id, iso(slot))


def _log_unfired(won: Sequence[_Plan]) -> None:
    """A warning for slots consumed by a fault, a debug line for a revoked owner's, and
    one line when a schedule starts waiting for its owner's quota (not at every look)."""
    for plan in won:
        if plan.tasks is None and plan.slots:
            log.log(logging.DEBUG if plan.problem == _CLIENT_REVOKED else logging.WARNING,
                    "schedule %s: %d slot(s) skipped, no task created: %s",
                    plan.schedule_id, len(plan.slots), plan.problem)
        if plan.waiting and not plan.was_held:
            log.info("schedule %s: %d slot(s) wait, client %s is at its max_active_tasks; "
                     "looking again at %s", plan.schedule_id, plan.waiting, plan.client_id,
                     iso(plan.next_slot_at))
