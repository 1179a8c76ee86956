"""The statements that fire schedule slots (the plan and its reasons:
`core.schedule_firing`, which runs them in one transaction per chunk).

PostgreSQL and SQLite differ in one place here: `lock_as_planned` locks the planned rows
with `FOR UPDATE SKIP LOCKED` on PostgreSQL, where sweepers race row by row; SQLite's
write transaction already holds the whole database.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from functools import cache
from typing import Any, Protocol

from sqlalchemy import (
    ARRAY,
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

from core.store.bulk import insert_rows, json_rows, rows_param
from core.store.database import Database
from core.tables import clients, models, schedule_slots, schedules


class PlannedClaim(Protocol):
    """What a claim needs of a plan: the row as it was read, and where it moves."""

    @property
    def schedule_id(self) -> str: ...
    @property
    def checkpoint(self) -> int: ...
    @property
    def cron(self) -> str: ...
    @property
    def checkpoint_to(self) -> int: ...
    @property
    def next_slot_at(self) -> int: ...


def due_schedules(db: Database, now: int, limit: int) -> tuple[list[Row[Any]], set[str]]:
    """Up to `limit` schedules due at `now` (oldest due first, through the
    `next_slot_at` index) with their owners' own `max_active_tasks` (None: the
    setting's default, also for an owner unknown here), and the ids of the registered
    models, in one snapshot."""
    with db.read() as conn:
        rows: list[Row[Any]] = list(conn.execute(
            select(schedules.c.id, schedules.c.client_id, schedules.c.cron,
                   schedules.c.request_json, schedules.c.catch_up, schedules.c.checkpoint,
                   schedules.c.next_slot_at, clients.c.max_active_tasks)
            .outerjoin(clients, clients.c.id == schedules.c.client_id)
            .where(schedules.c.next_slot_at <= now)
            .order_by(schedules.c.next_slot_at, schedules.c.id)
            .limit(limit)
        ))
        known_models = set(conn.execute(select(models.c.id)).scalars())
    return rows, known_models


# Uncorrelated on purpose: SQLite's RETURNING is rendered without table names, where
# a correlated `clients.id = schedules.client_id` would only resolve by luck.
_OWNER_REVOKED = schedules.c.client_id.in_(
    select(clients.c.id).where(clients.c.revoked_at.is_not(None)))


# The ids go as an array on PostgreSQL, whose length the planner knows: it looks them up
# by key (joined to a JSON table, which it guesses at 100 rows, it scanned the whole table).
_PLANNED_IDS = bindparam("ids", type_=ARRAY(String()))
_AS_READ = (schedules.c.id, schedules.c.checkpoint, schedules.c.cron,
            _OWNER_REVOKED.label("revoked"))
# PostgreSQL: lock the planned rows, passing over those a racing sweeper holds.
_LOCK_PLANNED = (select(*_AS_READ).where(schedules.c.id == any_(_PLANNED_IDS))
                 .with_for_update(skip_locked=True))
_READ_PLANNED = select(*_AS_READ).where(
    schedules.c.id.in_(bindparam("ids", expanding=True)))


def lock_as_planned(conn: Connection, plans: Sequence[PlannedClaim]) -> dict[str, bool]:
    """The planned schedules whose `(checkpoint, cron)` are still what the plan was
    computed from, each with whether its owner is revoked; from here to the commit they
    are this caller's to fire (PostgreSQL: locked, passing over the rows a racing sweeper
    holds; SQLite: the write transaction holds the whole database). A schedule edited,
    deleted or fired meanwhile is left out. The revocation is read in the transaction
    that creates the tasks, so one committed before it is never missed."""
    planned = {p.schedule_id: (p.checkpoint, p.cron) for p in plans}
    statement = _LOCK_PLANNED if conn.dialect.name == "postgresql" else _READ_PLANNED
    rows = conn.execute(statement, {"ids": list(planned)})
    return {row.id: bool(row.revoked) for row in rows
            if planned[row.id] == (row.checkpoint, row.cron)}


@cache
def _claim_statement(dialect_name: str) -> Any:
    """The UPDATE of `claim_schedules`, built once per dialect: the plans travel as one
    JSON parameter, so its text is the same for every chunk (`core.store.bulk`)."""
    plan = json_rows(dialect_name, "plan", [
        ("id", String()), ("checkpoint", BigInteger()), ("cron", String()),
        ("checkpoint_to", BigInteger()), ("next_slot_at", BigInteger())])
    as_planned = [schedules.c.id == plan.c.id, schedules.c.checkpoint == plan.c.checkpoint,
                  schedules.c.cron == plan.c.cron]
    if dialect_name == "postgresql":  # the planner's key lookup (`_PLANNED_IDS`)
        as_planned.append(schedules.c.id == any_(_PLANNED_IDS))
    return (
        update(schedules).where(*as_planned)
        .values(checkpoint=plan.c.checkpoint_to, next_slot_at=plan.c.next_slot_at)
        .returning(schedules.c.id)
    )


def claim_schedules(conn: Connection, plans: Sequence[PlannedClaim]) -> set[str]:
    """Move the schedules `lock_as_planned` gave to their new checkpoint and next look;
    the ids moved. The statement that moves a checkpoint carries its own fence (the row
    as read), so it can never move one that another sweeper or an edit moved first."""
    if not plans:
        return set()
    claimed = conn.execute(_claim_statement(conn.dialect.name), {
        "ids": [p.schedule_id for p in plans],
        "plan": rows_param([{"id": p.schedule_id, "checkpoint": p.checkpoint, "cron": p.cron,
                             "checkpoint_to": p.checkpoint_to,
                             "next_slot_at": p.next_slot_at} for p in plans])})
    return {row.id for row in claimed}


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
    conn: Connection, slots: Iterable[tuple[str, int]], now: int
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
