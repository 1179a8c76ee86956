"""Creating, reading, cancelling and deleting tasks: the client-facing store operations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Row, bindparam, delete, insert, select

from core.errors import Conflict, InvalidInput, NotFound
from core.idempotency import IdempotencyClaim
from core.ids import sortable_id
from core.objects import response_object
from core.states import TERMINAL, OnRestart, Status
from core.store.database import Database
from core.store.transitions import Event, move
from core.tables import idempotency_keys, models, responses, task_events, tasks


@dataclass(frozen=True)
class NewTask:
    client_id: str
    model: str
    request_json: str
    on_restart: OnRestart = OnRestart.RETRY
    max_attempts: int = 3
    run_at: int | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    dedupe_key: str | None = None
    schedule_id: str | None = None
    retry_of: str | None = None


@dataclass(frozen=True)
class Enqueued:
    """The outcome of `enqueue`: the answer a client gets, byte for byte."""

    task_id: str
    status_code: int
    body: bytes
    replayed: bool = False
    dedupe_hit: bool = False


class _KeyTaken(Exception):
    """The idempotency key is already recorded: roll back, then answer from the record."""


class _DedupeHit(Exception):
    """An active task holds the dedupe key: roll back, then answer with that task."""


def enqueue(
    db: Database,
    new: NewTask,
    *,
    idempotency: IdempotencyClaim | None = None,
    idempotency_ttl_ms: int = 24 * 3600 * 1000,
) -> Enqueued:
    """Persist task, response row, `response.created` and the idempotency record at once.

    A second request with the same idempotency key gets the stored answer (or
    `idempotency_key_reused`); one with the active task's `dedupe_key` gets that task
    (`200`, nothing created). Both are decided by unique indexes, never by a prior read:
    the common path is five statements and one commit, and only a conflict reads.
    """
    try:
        with db.write() as conn:
            now = db.clock.now_ms()
            created = insert_task(db, conn, new, now)
            if created is None:
                raise _DedupeHit
            body = _json_bytes(response_object(created, None))
            if idempotency is not None and not _record_key(
                db, conn, new.client_id, idempotency, created.id, body, now, idempotency_ttl_ms
            ):
                raise _KeyTaken
            db.announce_work(conn)
            return Enqueued(created.id, 202, body)
    except (_KeyTaken, _DedupeHit, InvalidInput) as refusal:
        if idempotency is not None:
            stored = _stored_answer(db, new.client_id, idempotency)
            if stored is not None:
                return stored
            if isinstance(refusal, _KeyTaken):  # the record had expired and is gone now
                return enqueue(db, new, idempotency=idempotency,
                               idempotency_ttl_ms=idempotency_ttl_ms)
        if isinstance(refusal, InvalidInput):
            raise
        return _dedupe_answer(db, new, idempotency, idempotency_ttl_ms)


def _dedupe_answer(
    db: Database, new: NewTask, idempotency: IdempotencyClaim | None, ttl_ms: int
) -> Enqueued:
    with db.read() as conn:
        holder = conn.execute(
            select(tasks.c.id).where(
                tasks.c.client_id == new.client_id,
                tasks.c.dedupe_key == new.dedupe_key,
                tasks.c.status.in_([s.value for s in Status if s not in TERMINAL]),
            )
        ).scalar()
        if holder is not None:
            return Enqueued(holder, 200, _json_bytes(current_response(conn, holder)),
                            dedupe_hit=True)
    # The holder finished in between: the key is free again.
    return enqueue(db, new, idempotency=idempotency, idempotency_ttl_ms=ttl_ms)


_MODEL_EXISTS = select(models.c.id).where(models.c.id == bindparam("model"))
_INSERT_RESPONSE = insert(responses)
_INSERT_EVENT = insert(task_events)


def insert_task(db: Database, conn: Connection, new: NewTask, now: int) -> SimpleNamespace | None:
    """Insert a task with its response row and first event; None on a dedupe conflict.

    Shared by `enqueue`, retries of dead letters and schedule firing, so every task is
    born the same way. Refuses an unknown model before writing anything. Returns the
    new task's columns (with empty response columns), enough to render it without a
    read-back.
    """
    if conn.execute(_MODEL_EXISTS, {"model": new.model}).first() is None:
        raise InvalidInput("model_not_found", "no model is registered under that id",
                           extra={"field": "model"})
    values = {
        "id": sortable_id("resp", now), "client_id": new.client_id, "model": new.model,
        "status": Status.QUEUED.value, "on_restart": new.on_restart.value, "attempts": 0,
        "max_attempts": new.max_attempts, "created_at": now, "updated_at": now,
        "run_at": max(now, new.run_at) if new.run_at is not None else now,
        "started_at": None, "finished_at": None, "owner_token": None,
        "lease_expires_at": None, "node_id": None, "last_seq": 1,
        "dedupe_key": new.dedupe_key, "error_code": None, "error_message": None,
        "dead_lettered": 0, "metadata_json": json.dumps(new.metadata, separators=(",", ":")),
        "request_json": new.request_json, "snapshot_json": None,
        "schedule_id": new.schedule_id, "retry_of": new.retry_of,
    }
    if conn.execute(db.insert_ignoring_conflicts(tasks, tasks.c.id), values).first() is None:
        return None
    conn.execute(_INSERT_RESPONSE, {"task_id": values["id"], "output_text": "",
                                    "updated_at": now})
    conn.execute(_INSERT_EVENT, {"task_id": values["id"], "seq": 1,
                                 "type": "response.created", "created_at": now, "data": "{}"})
    return SimpleNamespace(**values, output_text="", input_tokens=0, output_tokens=0)


def _record_key(
    db: Database,
    conn: Connection,
    client_id: str,
    claim: IdempotencyClaim,
    task_id: str,
    body: bytes,
    now: int,
    ttl_ms: int,
) -> bool:
    """Store the answer under the key; False when the key is already recorded.

    On PostgreSQL a concurrent holder of the same key makes this wait for its commit,
    so exactly one of two racing requests creates a task.
    """
    recorded = conn.execute(
        db.insert_ignoring_conflicts(idempotency_keys, idempotency_keys.c.key),
        {"client_id": client_id, "key": claim.key, "request_digest": claim.digest,
         "status_code": 202, "body": body.decode(), "task_id": task_id,
         "created_at": now, "expires_at": now + ttl_ms},
    ).first()
    return recorded is not None


def _stored_answer(db: Database, client_id: str, claim: IdempotencyClaim) -> Enqueued | None:
    """The recorded answer for the key (deleting it when expired), or None."""
    key_of = (idempotency_keys.c.client_id == client_id, idempotency_keys.c.key == claim.key)
    with db.write() as conn:
        stored = conn.execute(select(idempotency_keys).where(*key_of)).first()
        if stored is None:
            return None
        if stored.expires_at <= db.clock.now_ms():
            conn.execute(delete(idempotency_keys).where(*key_of))
            return None
    if stored.request_digest != claim.digest:
        raise InvalidInput(
            "idempotency_key_reused",
            "this Idempotency-Key was already used with a different request",
        )
    return Enqueued(stored.task_id, stored.status_code, stored.body.encode(), replayed=True)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def visible(client_id: str | None) -> list[Any]:
    """The `WHERE` that keeps a client to its own tasks (None: an admin sees all)."""
    return [] if client_id is None else [tasks.c.client_id == client_id]


def get_task(conn: Connection, task_id: str, client_id: str | None) -> Row[Any]:
    """The task with its response columns; another client's task is `NotFound`."""
    row = conn.execute(
        select(tasks, responses.c.output_text, responses.c.input_tokens,
               responses.c.output_tokens)
        .outerjoin(responses, responses.c.task_id == tasks.c.id)
        .where(tasks.c.id == task_id, *visible(client_id))
    ).first()
    if row is None:
        raise NotFound("task_not_found", "no such task")
    return row


def current_response(conn: Connection, task_id: str) -> dict[str, Any]:
    """The response object of a task as it stands now."""
    row = get_task(conn, task_id, None)
    return response_object(row, row)


def list_tasks(
    conn: Connection,
    client_id: str | None,
    *,
    status: Status | None = None,
    dead_lettered: bool = False,
    limit: int = 20,
    after: str | None = None,
) -> tuple[list[Row[Any]], str | None]:
    """A page of tasks, newest first; the cursor is the last id of the page."""
    query = select(tasks).where(*visible(client_id)).order_by(tasks.c.id.desc()).limit(limit + 1)
    if status is not None:
        query = query.where(tasks.c.status == status.value)
    if dead_lettered:
        query = query.where(tasks.c.dead_lettered == 1)
    if after is not None:
        query = query.where(tasks.c.id < after)
    rows = list(conn.execute(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


@dataclass(frozen=True)
class CancelOutcome:
    status_code: int  # 200 cancelled now, 202 cancelling
    task: Row[Any]


def cancel(db: Database, task_id: str, client_id: str | None) -> CancelOutcome:
    """SPEC 3.3: one conditional transition with its event; a finished task is 409."""
    with db.write() as conn:
        now = db.clock.now_ms()
        where = [tasks.c.id == task_id, *visible(client_id)]
        if move(conn, now=now, expected={Status.QUEUED}, where=where, to=Status.CANCELLED,
                events=[Event("response.cancelled")],
                values={"finished_at": now, "owner_token": None, "lease_expires_at": None}):
            return CancelOutcome(200, get_task(conn, task_id, client_id))
        if move(conn, now=now, expected={Status.LOADING, Status.RUNNING}, where=where,
                to=Status.CANCELLING, events=[Event("response.cancelling")]):
            return CancelOutcome(202, get_task(conn, task_id, client_id))
        task = get_task(conn, task_id, client_id)
        if task.status == Status.CANCELLING:
            return CancelOutcome(202, task)
    raise Conflict("task_already_finished", "the task has already finished",
                   extra={"task": task})


def delete_finished(db: Database, task_id: str, client_id: str | None) -> None:
    """Remove a finished task with its events and response; an active one is 409."""
    with db.write() as conn:
        task = get_task(conn, task_id, client_id)
        if Status(task.status) not in TERMINAL:
            raise Conflict("task_not_finished", "only a finished response can be deleted")
        conn.execute(delete(task_events).where(task_events.c.task_id == task_id))
        conn.execute(delete(responses).where(responses.c.task_id == task_id))
        conn.execute(delete(tasks).where(tasks.c.id == task_id))


def retry_failed(db: Database, task_id: str, max_attempts: int) -> str:
    """A new task with the request of a failed one (the failed one stays as it was)."""
    with db.write() as conn:
        old = get_task(conn, task_id, None)
        if old.status != Status.FAILED:
            raise Conflict("task_not_failed", "only a failed task can be retried")
        created = insert_task(db, conn, NewTask(
            client_id=old.client_id, model=old.model, request_json=old.request_json,
            on_restart=OnRestart(old.on_restart), max_attempts=max_attempts,
            metadata=json.loads(old.metadata_json), retry_of=old.id,
        ), db.clock.now_ms())
        if created is None:
            raise Conflict("dedupe_conflict", "an active task already holds this dedupe key")
        return str(created.id)


def read_events(
    conn: Connection, task_id: str, *, after: int = 0, limit: int = 100
) -> list[Row[Any]]:
    return list(
        conn.execute(
            select(task_events)
            .where(task_events.c.task_id == task_id, task_events.c.seq > after)
            .order_by(task_events.c.seq)
            .limit(limit)
        )
    )


def log_positions(conn: Connection, task_ids: Sequence[str]) -> dict[str, int]:
    """`last_seq` of each listed task that still exists (one statement for all of them).

    The API's live tail polls this for every stream and long-poll of its process at
    once, so following N tasks costs one indexed query per tick, not N.
    """
    rows = conn.execute(select(tasks.c.id, tasks.c.last_seq).where(tasks.c.id.in_(task_ids)))
    return {row.id: row.last_seq for row in rows}
