"""The worker's fenced writes on a task it holds: heartbeat, progress, failure,
cancel, requeue, release (completion, set-based, is `core.store.completion`).

Every write names `(id, owner_token, expected state)`. Zero rows changed means the
worker no longer owns the task: `fenced` then says why — a cancel request it must
honour (`CancelRequested`) or a lost lease (`LeaseLost`), after which the worker writes
nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Connection, Row, func, select, update

from core.clock import iso
from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.states import ERROR_MESSAGE_CHARS, OnRestart, Status, spent_by
from core.store.claims import dead_letter
from core.store.database import Database
from core.store.output_flush import add_outputs as add_outputs  # also the completion's
from core.store.output_flush import append_events
from core.store.redo_dropped import NOT_LANDED, Answer, Landing, write_through_drops
from core.store.transitions import Add, Event, Held, PerRow, move
from core.tables import responses, tasks


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


@dataclass(frozen=True)
class _Start:
    task_id: str
    owner: str


def start_running(db: Database, task_id: str, owner: str) -> None:
    """`loading -> running` once the model is loaded (redone after a dropped connection
    unless it landed: `_start_landed`)."""
    [failure] = write_through_drops(db, [_Start(task_id, owner)], partial(_start_alone, db),
                                    _start_landed)
    if failure is not None:
        raise failure


def _start_alone(db: Database, starts: Sequence[_Start]) -> list[Answer]:
    [start] = starts
    with db.write_events() as conn:
        _start(conn, db.clock.now_ms(), start.task_id, start.owner)
    return [None]


def _start_landed(conn: Connection, start: _Start) -> Answer | Landing:
    """The start landed once its owner holds the task `running` (nothing else moves it
    there while that owner holds it); not while still `loading`."""
    row = _held(conn, start.task_id, start.owner)
    if row is not None and row.status == Status.RUNNING:
        return None
    if row is not None and row.status == Status.LOADING:
        return NOT_LANDED
    return fenced(conn, start.task_id, start.owner)


def _held(conn: Connection, task_id: str, owner: str) -> Row[Any, Any] | None:
    """The task's status and output length, while `owner` holds it."""
    return conn.execute(
        select(tasks.c.status, func.length(responses.c.output_text).label("output_chars"))
        .join(responses, responses.c.task_id == tasks.c.id)
        .where(*_mine(task_id, owner))
    ).first()


def _start(conn: Connection, now: int, task_id: str, owner: str) -> None:
    if not start_all(conn, now, Held.one(task_id, owner)):
        raise fenced(conn, task_id, owner)


def start_all(
    conn: Connection, now: int, held: Held, event_rows: list[dict[str, Any]] | None = None
) -> list[Row[Any]]:
    """`loading -> running` for every task `held` names; the rows moved (`event_rows`:
    see `transitions.move`)."""
    return move(conn, now=now, expected={Status.LOADING}, where=held, to=Status.RUNNING,
                events=[Event("response.in_progress")], event_rows=event_rows)


@dataclass(frozen=True)
class OutputWrite:
    """One attempt's flush: its events (deltas, item/part events) with the snapshot,
    text and usage they imply, by the worker holding it (`start`: see `append_output`).
    `output_chars`: the length of the response's output once this write lands, which
    tells a landed write from one that did not after a dropped connection
    (`_output_landed`); None: not known, and a drop is raised as it is."""

    task_id: str
    owner: str
    events: Sequence[Event]
    text: str = ""
    snapshot_json: str | None = None
    usage: Usage | None = None
    start: bool = False
    output_chars: int | None = None


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
    move in the same transaction (a worker that batches its first writes). The events,
    the start's `response.in_progress` included, ride in the commit's announcement
    (`logged`): the streams of this process that already hold everything before them
    send them without reading the log.
    """
    append_one(db, OutputWrite(task_id, owner, events, text, snapshot_json, usage, start))


def append_one(db: Database, write: OutputWrite) -> None:
    """`append_output` of one prepared write, in a transaction of its own; raises its
    fenced failure."""
    [failure] = append_outputs(db, [write])
    if failure is not None:
        raise failure


def append_outputs(db: Database, writes: Sequence[OutputWrite]) -> list[Exception | None]:
    """`append_output` of several attempts in one transaction, each fenced on its own:
    for each, None once written, or why its fence did not hold (`fenced`: nothing of it
    written, the others are). A worker's attempts whose flushes fall due together
    share the commit, the larger part of a flush's cost (`scheduler.stream_thread`).
    After a dropped connection the writes that did not land are written again, when
    each can tell (`_output_landed`)."""
    told = all(write.output_chars is not None and write.text for write in writes)
    return write_through_drops(db, writes, partial(_append_outputs, db),
                               _output_landed if told else None)


def _output_landed(conn: Connection, write: OutputWrite) -> Answer | Landing:
    """A flush landed once its owner's response holds `output_chars` of output: only
    that owner's writes add to it, and each flush adds its text (never empty here), so
    the length before the flush is `output_chars - len(text)`. The flush's events, its
    snapshot and a pending start commit with that text or not at all."""
    assert write.output_chars is not None
    row = _held(conn, write.task_id, write.owner)
    if row is not None and row.output_chars == write.output_chars:
        return None
    expected = Status.LOADING if write.start else Status.RUNNING
    if (row is not None and row.status == expected
            and row.output_chars == write.output_chars - len(write.text)):
        return NOT_LANDED
    return fenced(conn, write.task_id, write.owner)


def _append_outputs(db: Database, writes: Sequence[OutputWrite]) -> list[Answer]:
    failures: list[Answer] = []
    with db.write_events() as conn:  # a fenced write logs nothing, so wakes nobody
        now = db.clock.now_ms()
        outputs: list[tuple[str, str, Usage | None]] = []
        for write in writes:
            started = not write.start or start_all(conn, now, Held.one(write.task_id,
                                                                        write.owner))
            if not started or append_events(conn, now, write.task_id, write.owner,
                                            write.events, write.snapshot_json) is None:
                failures.append(fenced(conn, write.task_id, write.owner))
                continue
            failures.append(None)
            outputs.append((write.task_id, write.text, write.usage))
        if outputs:
            add_outputs(conn, now, outputs)
    return failures


def terminal_values(now: int) -> dict[str, Any]:
    """The values every terminal move sets: finished now, no owner, no lease."""
    return {"finished_at": now, "owner_token": None, "lease_expires_at": None}


def fail(db: Database, task_id: str, owner: str, code: str, message: str) -> None:
    """A non-retryable failure: `failed` at once, not a dead letter."""
    with db.write_events() as conn:
        now = db.clock.now_ms()
        error = {"code": code, "message": message[:ERROR_MESSAGE_CHARS]}
        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held.one(task_id, owner), to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": False})],
                    values={**terminal_values(now), "error_code": code,
                            "error_message": error["message"]}):
            raise fenced(conn, task_id, owner)


def finish_cancelled(db: Database, task_id: str, owner: str) -> None:
    """The worker honours a cancel request: `cancelling -> cancelled`."""
    with db.write_events() as conn:
        now = db.clock.now_ms()
        if not move(conn, now=now, expected={Status.CANCELLING}, where=Held.one(task_id, owner),
                    to=Status.CANCELLED, events=[Event("response.cancelled")],
                    values=terminal_values(now)):
            raise LeaseLost(task_id)


def requeue(
    db: Database, task_id: str, owner: str, *, delay_ms: int, code: str, message: str
) -> bool:
    """A retryable failure: back to `queued` after `delay_ms`, or a dead letter when the
    attempts are spent. Returns True when requeued, False when dead-lettered."""
    with db.write_events() as conn:
        now = db.clock.now_ms()
        active = {Status.LOADING, Status.RUNNING}
        run_at = now + delay_ms

        queued = PerRow(1, lambda row: [Event("response.queued", {
            "reason": "retry", "attempt": row.attempts, "run_at": iso(run_at),
            "error": {"code": code, "message": message[:ERROR_MESSAGE_CHARS]}})])

        if move(conn, now=now, expected=active,
                where=[*_mine(task_id, owner), tasks.c.attempts < tasks.c.max_attempts],
                to=Status.QUEUED, events=queued,
                values={"run_at": run_at, "owner_token": None, "lease_expires_at": None,
                        "error_code": code,
                        "error_message": message[:ERROR_MESSAGE_CHARS]}):
            return True
        owned = conn.execute(select(tasks.c.status).where(*_mine(task_id, owner))).first()
        if owned is None or Status(owned.status) not in active or not dead_letter(
                conn, now, Held.one(task_id, owner), expected=Status(owned.status),
                error=spent_by(code, message)):
            raise fenced(conn, task_id, owner)
        return False


def release(db: Database, task_id: str, owner: str, *, delay_ms: int = 0) -> None:
    """Hand the task back, refunding the attempt, due again after `delay_ms`: at a
    graceful stop, or when the attempt could send nothing (every upstream URL cooling
    down in this process).

    A `resume` task that was running stays `running` with its snapshot and no lease,
    so the next claim from `run_at` on continues it; anything else goes back to `queued`.
    """
    with db.write_events() as conn:
        now = db.clock.now_ms()
        run_at = now + delay_ms
        refund = {"owner_token": None, "lease_expires_at": None, "attempts": Add(-1)}
        # A resumable task keeps its place among the resumable ones unless it must wait.
        waits = {"run_at": run_at} if delay_ms > 0 else {}
        if move(conn, now=now, expected={Status.RUNNING},
                where=[*_mine(task_id, owner), tasks.c.on_restart == OnRestart.RESUME.value],
                to=Status.RUNNING, events=[], values={**refund, **waits}):
            return

        released = PerRow(1, lambda row: [Event("response.queued", {
            "reason": "released", "attempt": row.attempts, "run_at": iso(run_at)})])

        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held.one(task_id, owner), to=Status.QUEUED, events=released,
                    values={**refund, "run_at": run_at}):
            raise fenced(conn, task_id, owner)
