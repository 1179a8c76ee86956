"""The worker's side of a task: claim, heartbeat, progress, finish, requeue, release.

Every write after the claim names `(id, owner_token, expected state)`. Zero rows
changed means the worker no longer owns the task: `fenced` then says why — a cancel
request it must honour (`CancelRequested`) or a lost lease (`LeaseLost`), after which
the worker writes nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select, update

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.ids import new_owner_token
from core.states import OnRestart, Status
from core.store.database import Database
from core.store.transitions import Event, Held, move, per_row
from core.tables import responses, tasks

MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"


@dataclass(frozen=True)
class Claim:
    """A task this worker now owns, with what it needs to run or resume it."""

    task_id: str
    owner_token: str
    attempt: int
    resumed: bool
    model: str
    request_json: str
    snapshot_json: str | None
    output_text: str
    usage: Usage


def claim(db: Database, *, limit: int, lease_ms: int, node_id: str) -> list[Claim]:
    """Take up to `limit` due tasks, oldest first, in one short transaction.

    Resumable `running` tasks (lease expired or cleared) come before due `queued` ones.
    A task whose attempts are spent is dead-lettered here instead of being claimed.
    """
    if limit <= 0:
        return []
    with db.write() as conn:
        now = db.clock.now_ms()
        owner = new_owner_token()
        lease = {"owner_token": owner, "lease_expires_at": now + lease_ms, "node_id": node_id,
                 "attempts": tasks.c.attempts + 1}
        resumable = _candidates(conn, limit, [
            tasks.c.status == Status.RUNNING.value,
            tasks.c.on_restart == OnRestart.RESUME.value,
            (tasks.c.lease_expires_at.is_(None)) | (tasks.c.lease_expires_at <= now),
        ])
        queued = _candidates(conn, limit - len(resumable), [
            tasks.c.status == Status.QUEUED.value, tasks.c.run_at <= now,
        ])
        claimed: list[str] = []
        for rows, status, event_type in (
            (resumable, Status.RUNNING, "response.in_progress"),
            (queued, Status.LOADING, "response.loading"),
        ):
            spent = [r.id for r in rows if r.attempts >= r.max_attempts]
            fresh = [r.id for r in rows if r.attempts < r.max_attempts]
            if spent:
                dead_letter(conn, now, spent, expected=Status(rows[0].status))
            if fresh:
                @per_row(1)
                def started(row: Row[Any], event_type: str = event_type) -> list[Event]:
                    return [Event(event_type, {"attempt": row.attempts})]

                fresh_start = {} if status is Status.RUNNING else {"snapshot_json": None}
                moved = move(conn, now=now, expected={Status(rows[0].status)},
                             where=[tasks.c.id.in_(fresh)], to=status, events=started,
                             values={**lease, **fresh_start,
                                     "started_at": func.coalesce(tasks.c.started_at, now)})
                if status is Status.LOADING:
                    reset_output(conn, [r.id for r in moved], now)
                claimed += [r.id for r in moved]
        return _claims(conn, claimed, owner, resumed_ids={r.id for r in resumable})


def _candidates(conn: Connection, limit: int, where: list[Any]) -> list[Row[Any]]:
    if limit <= 0:
        return []
    query = (
        select(tasks.c.id, tasks.c.status, tasks.c.attempts, tasks.c.max_attempts)
        .where(*where)
        .order_by(tasks.c.run_at, tasks.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(conn.execute(query))


def dead_letter(conn: Connection, now: int, ids: Sequence[str], *, expected: Status) -> None:
    """Fail tasks whose attempts are spent, marked as dead letters."""
    error = {"code": MAX_ATTEMPTS_EXCEEDED, "message": "the task used all its attempts"}
    move(conn, now=now, expected={expected}, where=[tasks.c.id.in_(ids)], to=Status.FAILED,
         events=[Event("response.failed", {"error": error, "dead_lettered": True})],
         values={"finished_at": now, "owner_token": None, "lease_expires_at": None,
                 "error_code": error["code"], "error_message": error["message"],
                 "dead_lettered": 1})


def _claims(conn: Connection, ids: list[str], owner: str, resumed_ids: set[str]) -> list[Claim]:
    if not ids:
        return []
    rows = conn.execute(
        select(tasks.c.id, tasks.c.attempts, tasks.c.model, tasks.c.request_json,
               tasks.c.snapshot_json, responses.c.output_text, responses.c.input_tokens,
               responses.c.output_tokens)
        .join(responses, responses.c.task_id == tasks.c.id)
        .where(tasks.c.id.in_(ids))
        .order_by(tasks.c.run_at, tasks.c.id)
    )
    return [
        Claim(task_id=r.id, owner_token=owner, attempt=r.attempts, resumed=r.id in resumed_ids,
              model=r.model, request_json=r.request_json, snapshot_json=r.snapshot_json,
              output_text=r.output_text, usage=Usage(r.input_tokens, r.output_tokens))
        for r in rows
    ]


def _mine(task_id: str, owner: str) -> list[Any]:
    return [tasks.c.id == task_id, tasks.c.owner_token == owner]




def fenced(conn: Connection, task_id: str, owner: str) -> Exception:
    """Why a fenced write changed nothing: a cancel to honour, or a lost lease."""
    row = conn.execute(
        select(tasks.c.status, tasks.c.owner_token).where(tasks.c.id == task_id)
    ).first()
    if row is not None and row.owner_token == owner and row.status == Status.CANCELLING:
        return CancelRequested(task_id)
    return LeaseLost(task_id)


def heartbeat(db: Database, task_id: str, owner: str, *, lease_ms: int) -> Status:
    """Renew the lease; returns the current state so the worker sees `cancelling` too."""
    with db.write() as conn:
        now = db.clock.now_ms()
        row = conn.execute(
            update(tasks)
            .where(*_mine(task_id, owner),
                   tasks.c.status.in_([s.value for s in (Status.LOADING, Status.RUNNING,
                                                         Status.CANCELLING)]))
            .values(lease_expires_at=now + lease_ms)
            .returning(tasks.c.status)
        ).first()
        if row is None:
            raise LeaseLost(task_id)
        return Status(row.status)


def start_running(db: Database, task_id: str, owner: str) -> None:
    """`loading -> running` once the model is loaded."""
    with db.write() as conn:
        _start(conn, db.clock.now_ms(), task_id, owner)


def _start(conn: Connection, now: int, task_id: str, owner: str) -> None:
    if not move(conn, now=now, expected={Status.LOADING}, where=Held(task_id, owner),
                to=Status.RUNNING, events=[Event("response.in_progress")]):
        raise fenced(conn, task_id, owner)


def append_output(
    db: Database,
    task_id: str,
    owner: str,
    events: Sequence[Event],
    *,
    text: str = "",
    snapshot_json: str | None = None,
    usage: Usage | None = None,
    start: bool = False,
) -> None:
    """Append events (deltas, item/part events) with the snapshot and text they imply.

    Events, snapshot and output text move together, so a resumed task continues from
    exactly what its clients have seen. `start=True` first makes the `start_running`
    move in the same transaction (a worker that batches its first writes).
    """
    with db.write() as conn:
        now = db.clock.now_ms()
        if start:
            _start(conn, now, task_id, owner)
        values = {} if snapshot_json is None else {"snapshot_json": snapshot_json}
        if not move(conn, now=now, expected={Status.RUNNING}, where=Held(task_id, owner),
                    to=None, events=events, values=values):
            raise fenced(conn, task_id, owner)
        _add_output(conn, task_id, now, text, usage)


def _add_output(conn: Connection, task_id: str, now: int, text: str, usage: Usage | None) -> None:
    params: dict[str, Any] = {"p_task_id": task_id, "p_now": now, "p_text": text}
    if usage is not None:
        params.update(p_in=usage.input_tokens, p_out=usage.output_tokens)
    conn.execute(_ADD_OUTPUT[usage is not None], params)


def _output_update(with_usage: bool) -> Any:
    values: dict[str, Any] = {"updated_at": bindparam("p_now"),
                              "output_text": responses.c.output_text + bindparam("p_text")}
    if with_usage:
        values.update(input_tokens=bindparam("p_in"), output_tokens=bindparam("p_out"))
    return (update(responses).where(responses.c.task_id == bindparam("p_task_id"))
            .values(**values))


# Prepared once (see `transitions.Held`): appending output is the worker's hottest write.
_ADD_OUTPUT = {with_usage: _output_update(with_usage) for with_usage in (False, True)}


def complete(
    db: Database, task_id: str, owner: str, closing: Sequence[Event], *, usage: Usage,
    text: str = "",
    start: bool = False,
) -> None:
    """`running -> completed` with the closing item/part events and the terminal one.

    `text` is output not yet stored (the last deltas ride in `closing`), so the end of
    a task costs one transaction; with `start=True` so does a whole short generation
    (`loading -> running -> completed`, each move with its event)."""
    with db.write() as conn:
        now = db.clock.now_ms()
        if start:
            _start(conn, now, task_id, owner)
        if not move(conn, now=now, expected={Status.RUNNING}, where=Held(task_id, owner),
                    to=Status.COMPLETED, events=[*closing, Event("response.completed")],
                    values=_finished(now)):
            raise fenced(conn, task_id, owner)
        _add_output(conn, task_id, now, text, usage)


def _finished(now: int) -> dict[str, Any]:
    return {"finished_at": now, "owner_token": None, "lease_expires_at": None}


def fail(db: Database, task_id: str, owner: str, code: str, message: str) -> None:
    """A non-retryable failure: `failed` at once, not a dead letter."""
    with db.write() as conn:
        now = db.clock.now_ms()
        error = {"code": code, "message": message[:500]}
        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held(task_id, owner), to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": False})],
                    values={**_finished(now), "error_code": code,
                            "error_message": error["message"]}):
            raise fenced(conn, task_id, owner)


def finish_cancelled(db: Database, task_id: str, owner: str) -> None:
    """The worker honours a cancel request: `cancelling -> cancelled`."""
    with db.write() as conn:
        now = db.clock.now_ms()
        if not move(conn, now=now, expected={Status.CANCELLING}, where=Held(task_id, owner),
                    to=Status.CANCELLED, events=[Event("response.cancelled")],
                    values=_finished(now)):
            raise LeaseLost(task_id)


def requeue(
    db: Database, task_id: str, owner: str, *, delay_ms: int, code: str, message: str
) -> bool:
    """A retryable failure: back to `queued` after `delay_ms`, or a dead letter when the
    attempts are spent. Returns True when requeued, False when dead-lettered."""
    with db.write() as conn:
        now = db.clock.now_ms()
        active = {Status.LOADING, Status.RUNNING}
        run_at = now + delay_ms

        @per_row(1)
        def queued(row: Row[Any]) -> list[Event]:
            return [Event("response.queued", {"reason": "retry", "attempt": row.attempts,
                                              "run_at": run_at,
                                              "error": {"code": code, "message": message[:500]}})]

        if move(conn, now=now, expected=active,
                where=[*_mine(task_id, owner), tasks.c.attempts < tasks.c.max_attempts],
                to=Status.QUEUED, events=queued,
                values={"run_at": run_at, "owner_token": None, "lease_expires_at": None,
                        "error_code": code,
                        "error_message": message[:500]}):
            return True
        owned = conn.execute(select(tasks.c.status).where(*_mine(task_id, owner))).first()
        if owned is None or Status(owned.status) not in active:
            raise fenced(conn, task_id, owner)
        dead_letter(conn, now, [task_id], expected=Status(owned.status))
        return False


def release(db: Database, task_id: str, owner: str) -> None:
    """Graceful stop: hand the task back, refunding the attempt.

    A `resume` task that was running stays `running` with its snapshot and no lease,
    so the next claim continues it; anything else goes back to `queued`.
    """
    with db.write() as conn:
        now = db.clock.now_ms()
        refund = {"owner_token": None, "lease_expires_at": None,
                  "attempts": tasks.c.attempts - 1}
        if move(conn, now=now, expected={Status.RUNNING},
                where=[*_mine(task_id, owner), tasks.c.on_restart == OnRestart.RESUME.value],
                to=Status.RUNNING, events=[], values=refund):
            return

        @per_row(1)
        def released(row: Row[Any]) -> list[Event]:
            return [Event("response.queued", {"reason": "released", "attempt": row.attempts,
                                              "run_at": now})]

        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held(task_id, owner), to=Status.QUEUED, events=released,
                    values={**refund, "run_at": now}):
            raise fenced(conn, task_id, owner)


def reset_output(conn: Connection, ids: Sequence[str], now: int) -> None:
    """A task that starts over starts with empty output and usage.

    Done when a queued task is claimed, so requeue, release and recovery (which can
    touch 100,000 tasks at once) never have to rewrite response rows."""
    conn.execute(
        update(responses)
        .where(responses.c.task_id.in_(ids))
        .values(output_text="", input_tokens=0, output_tokens=0, updated_at=now)
    )
