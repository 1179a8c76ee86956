"""The worker's fenced writes on a task it holds: heartbeat, progress, failure,
cancel, requeue, release (completion, set-based, is `core.store.completion`).

Every write names `(id, owner_token, expected state)`. Zero rows changed means the
worker no longer owns the task: `fenced` then says why — a cancel request it must
honour (`CancelRequested`) or a lost lease (`LeaseLost`), after which the worker writes
nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, func, select, update
from sqlalchemy.exc import DBAPIError

from core.clock import iso
from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.states import ERROR_MESSAGE_CHARS, OnRestart, Status, spent_by
from core.store.database import Database
from core.store.outage import is_row_held
from core.store.output_flush import add_outputs as add_outputs  # also the completion's
from core.store.output_flush import append_events
from core.store.redo_dropped import NOT_LANDED, Answer, Landed, Landing, write_through_drops
from core.store.transitions import Add, Event, Held, PerRow, dead_letter, move
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


def start_running(db: Database, task_id: str, owner: str) -> None:
    """`loading -> running` once the model is loaded (redone after a dropped connection
    unless it landed: `_start_landed`)."""
    start = _Ending(task_id, owner, None)
    _end_through_drops(db, start, partial(_start_alone, db, start), _start_landed)


def _start_alone(db: Database, start: _Ending) -> None:
    with db.write_events() as conn:
        _start(conn, db.clock.now_ms(), start.task_id, start.owner)


def _start_landed(conn: Connection, start: _Ending) -> Answer | Landing:
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
    each can tell (`_output_landed`).

    A transaction that met a row another transaction holds past the process's bound
    (`is_row_held`: PostgreSQL's `lock_timeout`, `core.store.connect`) is written
    again task by task (`each_apart`, `append_alone`), so that only the writes of held
    tasks fail, each answered with the held row's error; the others land."""
    try:
        return _written_through_drops(db, writes)
    except DBAPIError as exc:
        if not is_row_held(exc):
            raise
        return each_apart(exc, writes, partial(append_alone, db))


Item = TypeVar("Item")  # a write of a group: a flush, a completion


# How long a write tried apart (`each_apart`) waits for a row another transaction
# holds (PostgreSQL's `lock_timeout`, for that transaction). Long enough for the
# task's own renewal, which holds its row for a commit; short, as the thread that
# writes the flushes of every stream of the process waits it out for all of them.
ALONE_LOCK_WAIT_MS = 100


def each_apart(
    refused: DBAPIError, items: Sequence[Item], alone: Callable[[Item], Exception | None]
) -> list[Exception | None]:
    """The answers of `items` whose shared write a held row refused (`refused`,
    `is_row_held`): each written in a transaction of its own (`alone`, which waits only
    briefly: `wait_briefly`), so that only the held ones fail, each with its error,
    answered rather than raised; the others land. One item alone is `refused` itself.
    The one rule of the flushes and the completions a held row refused."""
    if len(items) == 1:
        return [refused]
    return [answered_alone(partial(alone, item)) for item in items]


def answered_alone(write: Callable[[], Exception | None]) -> Exception | None:
    """`write()`'s answer, or the store's error it raised, answered rather than raised:
    a write tried apart is followed on (`scheduler.stream_thread` parks a held one),
    never the end of its caller's pass."""
    try:
        return write()
    except DBAPIError as exc:
        return exc


def wait_briefly(conn: Connection) -> None:
    """Bound how long `conn`'s transaction waits for a row another transaction holds
    (PostgreSQL's `lock_timeout`; SQLite has no row locks): a write tried apart from
    others because a held row refused it (`each_apart`)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ALONE_LOCK_WAIT_MS}")


def append_alone(db: Database, write: OutputWrite) -> Exception | None:
    """One attempt's flush in a transaction of its own that waits only briefly for a
    row another transaction holds (`wait_briefly`): None once written, or why its fence
    did not hold (`fenced`); a store's error, the held row's (`is_row_held`) among
    them, is raised (`answered_alone` answers it)."""
    [answer] = _written_through_drops(db, [write], briefly=True)
    return answer


def _written_through_drops(db: Database, writes: Sequence[OutputWrite], *,
                           briefly: bool = False) -> list[Exception | None]:
    told = all(write.output_chars is not None and write.text for write in writes)
    return write_through_drops(db, writes,
                               partial(_append_outputs, db, briefly),
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


def _append_outputs(db: Database, briefly: bool,
                    writes: Sequence[OutputWrite]) -> list[Answer]:
    failures: list[Answer] = []
    with db.write_events() as conn:  # a fenced write logs nothing, so wakes nobody
        if briefly:
            wait_briefly(conn)
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


_WORKING = frozenset({Status.LOADING, Status.RUNNING})  # the states an attempt ends from
R = TypeVar("R")


@dataclass(frozen=True)
class _Ending:
    """An attempt's write of its start or its end: its task, its owner token and its
    number (`Claim.attempt`), which tells an ending's landing after a dropped connection
    from what another process did meanwhile (None: not known, and a drop is raised as it
    is; a start's or a cancel's landing does not need it)."""

    task_id: str
    owner: str
    attempt: int | None

    @property
    def held(self) -> Held:
        return Held.one(self.task_id, self.owner)

    def by_number(self, landed: Landed[_Ending, R]) -> Landed[_Ending, R] | None:
        """`landed`, which needs the attempt's number, when it is known."""
        return landed if self.attempt is not None else None


def unless_held(conn: Connection, task_id: str, owner: str, row: Row[*tuple[Any, ...]] | None,
                states: Collection[Status]) -> Exception | Landing:
    """For a write not found landed (`row`: the task's `status` and `owner_token`):
    `NOT_LANDED` while `owner` still holds the task in `states`, as the write expected
    it; else why its fence did not hold."""
    if row is not None and row.owner_token == owner and row.status in states:
        return NOT_LANDED
    return fenced(conn, task_id, owner)


def _end_through_drops(
    db: Database, ending: _Ending, write: Callable[[], R], landed: Landed[_Ending, R] | None
) -> R:
    """`write()`'s answer, written again after a dropped connection unless `landed` says
    it landed (None: a drop is raised as it is); raises its fenced failure."""
    [answer] = write_through_drops(db, [ending], lambda _: [write()], landed)
    if isinstance(answer, Exception):
        raise answer
    return answer


def _task(conn: Connection, task_id: str) -> Row[*tuple[Any, ...]] | None:
    """What tells an attempt's terminal write from another process's move."""
    return conn.execute(
        select(tasks.c.status, tasks.c.owner_token, tasks.c.attempts, tasks.c.dead_lettered,
               tasks.c.error_code, tasks.c.error_message).where(tasks.c.id == task_id)
    ).first()


def fail(
    db: Database, task_id: str, owner: str, code: str, message: str, *,
    attempt: int | None = None,
) -> None:
    """A non-retryable failure: `failed` at once, not a dead letter (redone after a
    dropped connection unless it landed: `_fail_landed`)."""
    ending = _Ending(task_id, owner, attempt)
    _end_through_drops(db, ending, partial(_fail, db, ending, code, message),
                       ending.by_number(partial(_fail_landed, code=code, message=message)))


def _fail(db: Database, ending: _Ending, code: str, message: str) -> None:
    with db.write_events() as conn:
        now = db.clock.now_ms()
        error = {"code": code, "message": message[:ERROR_MESSAGE_CHARS]}
        if not move(conn, now=now, expected=_WORKING, where=ending.held,
                    to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": False})],
                    values={**terminal_values(now), "error_code": code,
                            "error_message": error["message"]}):
            raise fenced(conn, ending.task_id, ending.owner)


def _fail_landed(conn: Connection, ending: _Ending, *, code: str, message: str
                 ) -> None | Exception | Landing:
    """The failure landed once the task is `failed` with this attempt's count, not a
    dead letter, with this failure's code and message. A lease expiry or a cold start
    under `fail` also ends it `failed` with that count, but with recovery's own error
    (`worker_lost`, `server_restarted`, and their messages), which no engine failure
    names; a claim's dead letter is marked one."""
    row = _task(conn, ending.task_id)
    if (row is not None and row.status == Status.FAILED and row.attempts == ending.attempt
            and not row.dead_lettered and row.error_code == code
            and row.error_message == message[:ERROR_MESSAGE_CHARS]):
        return None
    return unless_held(conn, ending.task_id, ending.owner, row, _WORKING)


def finish_cancelled(db: Database, task_id: str, owner: str) -> None:
    """The worker honours a cancel request: `cancelling -> cancelled` (redone after a
    dropped connection unless it landed: `_cancelled_landed`)."""
    ending = _Ending(task_id, owner, None)
    _end_through_drops(db, ending, partial(_finish_cancelled, db, ending), _cancelled_landed)


def _finish_cancelled(db: Database, ending: _Ending) -> None:
    with db.write_events() as conn:
        now = db.clock.now_ms()
        if not move(conn, now=now, expected={Status.CANCELLING}, where=ending.held,
                    to=Status.CANCELLED, events=[Event("response.cancelled")],
                    values=terminal_values(now)):
            raise LeaseLost(ending.task_id)


def _cancelled_landed(conn: Connection, ending: _Ending) -> None | Exception | Landing:
    """The cancel landed once the task is `cancelled`. Only one other writer moves a
    task this owner held `cancelling` there: lease expiry (or the sweep of orphaned
    cancels), once this attempt's lease ran out. It leaves the very same task and log
    (one `response.cancelled`, no owner), so the two cannot be told apart by what is
    stored, nor need to be: the cancel the client asked for is honoured once either
    way, and nothing is written again; the attempt counts as cancelled rather than
    lost. Not landed while its owner still holds the task `cancelling`; anything else
    is a lost lease, as the write itself would say."""
    row = _task(conn, ending.task_id)
    if row is not None and row.status == Status.CANCELLED:
        return None
    if row is not None and row.owner_token == ending.owner and row.status == Status.CANCELLING:
        return NOT_LANDED
    return LeaseLost(ending.task_id)


def requeue(
    db: Database, task_id: str, owner: str, *, delay_ms: int, code: str, message: str,
    attempt: int | None = None,
) -> bool:
    """A retryable failure: back to `queued` after `delay_ms`, or a dead letter when the
    attempts are spent. Returns True when requeued, False when dead-lettered. Redone
    after a dropped connection unless it landed (`_requeue_landed`)."""
    ending = _Ending(task_id, owner, attempt)
    return _end_through_drops(
        db, ending, partial(_requeue, db, ending, delay_ms, code, message),
        ending.by_number(partial(_requeue_landed, code=code, message=message)))


def _requeue(db: Database, ending: _Ending, delay_ms: int, code: str, message: str) -> bool:
    with db.write_events() as conn:
        now = db.clock.now_ms()
        run_at = now + delay_ms

        queued = PerRow(1, lambda row: [Event("response.queued", {
            "reason": "retry", "attempt": row.attempts, "run_at": iso(run_at),
            "error": {"code": code, "message": message[:ERROR_MESSAGE_CHARS]}})])

        if move(conn, now=now, expected=_WORKING,
                where=[*_mine(ending.task_id, ending.owner),
                       tasks.c.attempts < tasks.c.max_attempts],
                to=Status.QUEUED, events=queued,
                values={"run_at": run_at, "owner_token": None, "lease_expires_at": None,
                        "error_code": code,
                        "error_message": message[:ERROR_MESSAGE_CHARS]}):
            return True
        owned = conn.execute(select(tasks.c.status)
                             .where(*_mine(ending.task_id, ending.owner))).first()
        if owned is None or Status(owned.status) not in _WORKING or not dead_letter(
                conn, now, ending.held, expected=Status(owned.status),
                error=spent_by(code, message)):
            raise fenced(conn, ending.task_id, ending.owner)
        return False


def _requeue_landed(conn: Connection, ending: _Ending, *, code: str, message: str
                    ) -> bool | Exception | Landing:
    """The requeue landed once the task, with this attempt's count and no owner, is
    `queued` with this failure's code and message (True), or dead-lettered with the
    cause this failure gives it (`spent_by`: False). A claim clears the error and
    counts one attempt more, and a lease expiry or a cold start that puts the task back
    in the queue with that count writes no error, so only this write leaves a queued
    task so; a claim's dead letter says the attempts were spent without a cause, lease
    expiry under `fail` is no dead letter."""
    row = _task(conn, ending.task_id)
    if row is not None and row.attempts == ending.attempt and row.owner_token is None:
        if (row.status == Status.QUEUED and row.error_code == code
                and row.error_message == message[:ERROR_MESSAGE_CHARS]):
            return True
        if (row.status == Status.FAILED and row.dead_lettered
                and row.error_message == spent_by(code, message)["message"]):
            return False
    return unless_held(conn, ending.task_id, ending.owner, row, _WORKING)


def release(
    db: Database, task_id: str, owner: str, *, delay_ms: int = 0, attempt: int | None = None
) -> None:
    """Hand the task back, refunding the attempt, due again after `delay_ms`: at a
    graceful stop, or when the attempt could send nothing (every upstream URL cooling
    down in this process). Redone after a dropped connection unless it landed
    (`_release_landed`).

    A `resume` task that was running stays `running` with its snapshot and no lease,
    so the next claim from `run_at` on continues it; anything else goes back to `queued`.
    """
    ending = _Ending(task_id, owner, attempt)
    _end_through_drops(db, ending, partial(_release, db, ending, delay_ms),
                       ending.by_number(_release_landed))


def _release(db: Database, ending: _Ending, delay_ms: int) -> None:
    with db.write_events() as conn:
        now = db.clock.now_ms()
        run_at = now + delay_ms
        refund = {"owner_token": None, "lease_expires_at": None, "attempts": Add(-1)}
        # A resumable task keeps its place among the resumable ones unless it must wait.
        waits = {"run_at": run_at} if delay_ms > 0 else {}
        if move(conn, now=now, expected={Status.RUNNING},
                where=[*_mine(ending.task_id, ending.owner),
                       tasks.c.on_restart == OnRestart.RESUME.value],
                to=Status.RUNNING, events=[], values={**refund, **waits}):
            return

        released = PerRow(1, lambda row: [Event("response.queued", {
            "reason": "released", "attempt": row.attempts, "run_at": iso(run_at)})])

        if not move(conn, now=now, expected=_WORKING, where=ending.held, to=Status.QUEUED,
                    events=released, values={**refund, "run_at": run_at}):
            raise fenced(conn, ending.task_id, ending.owner)


def _release_landed(conn: Connection, ending: _Ending) -> None | Exception | Landing:
    """The release landed once the task counts one attempt less than this attempt's
    number. Nothing else lowers the count: every claim adds one, and only the owner's
    release gives it back. While this owner held the task no one else could release
    it, and once another process took it (lease expiry keeps the count, a claim then
    adds one) the count never came back below this attempt's."""
    assert ending.attempt is not None
    row = _task(conn, ending.task_id)
    if row is not None and row.attempts == ending.attempt - 1:
        return None
    return unless_held(conn, ending.task_id, ending.owner, row, _WORKING)
