"""The worker's side of a task: claim, heartbeat, progress, finish, requeue, release.

Every write after the claim names `(id, owner_token, expected state)`. Zero rows
changed means the worker no longer owns the task: `fenced` then says why — a cancel
request it must honour (`CancelRequested`) or a lost lease (`LeaseLost`), after which
the worker writes nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select, update

from core.engines.base import Usage
from core.errors import CancelRequested, LeaseLost
from core.ids import new_owner_token
from core.states import OnRestart, Status
from core.store.database import Database
from core.store.transitions import Add, Event, EventsFor, Held, IfNull, Locked, move, per_row
from core.tables import responses, task_events, tasks

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
    items_opened: int = 0  # `response.output_item.added` events already in the task's log


def claim(db: Database, *, limit: int, lease_ms: int, node_id: str) -> list[Claim]:
    """Take up to `limit` due tasks, oldest first, in one short transaction.

    Resumable `running` tasks (lease expired or cleared) come before due `queued` ones.
    A task whose attempts are spent is dead-lettered here instead of being claimed.
    Every statement is built once: a claim runs for every few tasks a worker executes.
    """
    if limit <= 0:
        return []
    with db.write() as conn:
        now = db.clock.now_ms()
        owner = new_owner_token()
        lease = {"owner_token": owner, "lease_expires_at": now + lease_ms, "node_id": node_id,
                 "attempts": Add(1), "started_at": IfNull(now)}
        resumable = _candidates(conn, _RESUMABLE, now, limit)
        queued = _candidates(conn, _QUEUED, now, limit - len(resumable))
        taken = _take(conn, now, resumable, Status.RUNNING, "response.in_progress", lease)
        taken += _take(conn, now, queued, Status.LOADING, "response.loading",
                       {**lease, "snapshot_json": None})
        if queued:
            reset_output(conn, [row.id for row, _ in taken if row.status == Status.LOADING], now)
        return [_claim(candidate, row.attempts, owner) for row, candidate in taken]


# How many output items earlier attempts opened (a retry opens its message at the next
# index: OpenAI's stream helper refuses a second item at one index). Counted over the
# task's own log by primary key; a first attempt's log holds two events.
_ITEMS_OPENED = (
    select(func.count())
    .select_from(task_events)
    .where(task_events.c.task_id == tasks.c.id,
           task_events.c.type == "response.output_item.added")
    .correlate(tasks)
    .scalar_subquery()
    .label("items_opened")
)


def _candidates_query(*where: Any, with_output: bool) -> Any:
    """Due tasks of one kind, oldest first, locked (`p_now`, `p_limit`); a resumable
    task brings its stored output along, a queued one starts over without it."""
    columns = [tasks.c.id, tasks.c.status, tasks.c.attempts, tasks.c.max_attempts,
               tasks.c.model, tasks.c.request_json, tasks.c.snapshot_json, _ITEMS_OPENED]
    query = select(*columns)
    if with_output:
        query = (select(*columns, responses.c.output_text, responses.c.input_tokens,
                        responses.c.output_tokens)
                 .join(responses, responses.c.task_id == tasks.c.id))
    return (query.where(*where)
            .order_by(tasks.c.run_at, tasks.c.id)
            .limit(bindparam("p_limit"))
            .with_for_update(skip_locked=True, of=tasks))


_RESUMABLE = _candidates_query(
    tasks.c.status == Status.RUNNING.value,
    tasks.c.on_restart == OnRestart.RESUME.value,
    tasks.c.lease_expires_at.is_(None) | (tasks.c.lease_expires_at <= bindparam("p_now")),
    with_output=True,
)
_QUEUED = _candidates_query(tasks.c.status == Status.QUEUED.value,
                            tasks.c.run_at <= bindparam("p_now"), with_output=False)


def _candidates(conn: Connection, query: Any, now: int, limit: int) -> list[Row[Any]]:
    if limit <= 0:
        return []
    return list(conn.execute(query, {"p_now": now, "p_limit": limit}))


def _take(
    conn: Connection, now: int, candidates: list[Row[Any]], to: Status, event_type: str,
    values: dict[str, Any],
) -> list[tuple[Row[Any], Row[Any]]]:
    """Claim the candidates whose attempts are left, dead-letter the others; returns
    (moved row, candidate row) pairs."""
    if not candidates:
        return []
    expected = Status(candidates[0].status)
    spent = [c.id for c in candidates if c.attempts >= c.max_attempts]
    if spent:
        dead_letter(conn, now, Locked(tuple(spent)), expected=expected)
    fresh = {c.id: c for c in candidates if c.attempts < c.max_attempts}
    if not fresh:
        return []

    @per_row(1)
    def started(row: Row[Any]) -> list[Event]:
        return [Event(event_type, {"attempt": row.attempts})]

    moved = move(conn, now=now, expected={expected}, where=Locked(tuple(fresh)), to=to,
                 events=started, values=values)
    by_id = {row.id: row for row in moved}
    return [(by_id[i], c) for i, c in fresh.items() if i in by_id]


def _claim(candidate: Row[Any], attempt: int, owner: str) -> Claim:
    resumed = candidate.status == Status.RUNNING
    return Claim(task_id=candidate.id, owner_token=owner, attempt=attempt, resumed=resumed,
                 model=candidate.model, request_json=candidate.request_json,
                 snapshot_json=candidate.snapshot_json if resumed else None,
                 output_text=candidate.output_text if resumed else "",
                 usage=(Usage(candidate.input_tokens, candidate.output_tokens) if resumed
                        else Usage()),
                 items_opened=candidate.items_opened)


def dead_letter(conn: Connection, now: int, where: Held | Locked, *, expected: Status) -> int:
    """Fail tasks whose attempts are spent, marked as dead letters; how many."""
    error = {"code": MAX_ATTEMPTS_EXCEEDED, "message": "the task used all its attempts"}
    return len(move(conn, now=now, expected={expected}, where=where, to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": True})],
                    values={"finished_at": now, "owner_token": None, "lease_expires_at": None,
                            "error_code": error["code"], "error_message": error["message"],
                            "dead_lettered": 1}))


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
    if not _start_all(conn, now, Held.one(task_id, owner)):
        raise fenced(conn, task_id, owner)


def _start_all(conn: Connection, now: int, held: Held) -> list[Row[Any]]:
    return move(conn, now=now, expected={Status.LOADING}, where=held, to=Status.RUNNING,
                events=[Event("response.in_progress")])


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
        if not move(conn, now=now, expected={Status.RUNNING}, where=Held.one(task_id, owner),
                    to=None, events=events, values=values):
            raise fenced(conn, task_id, owner)
        _add_output(conn, task_id, now, text, usage)


def _add_output(conn: Connection, task_id: str, now: int, text: str, usage: Usage | None) -> None:
    conn.execute(_ADD_OUTPUT[usage is not None], _output_params(task_id, now, text, usage))


def _output_params(task_id: str, now: int, text: str, usage: Usage | None) -> dict[str, Any]:
    params: dict[str, Any] = {"p_task_id": task_id, "p_now": now, "p_text": text}
    if usage is not None:
        params.update(p_in=usage.input_tokens, p_out=usage.output_tokens)
    return params


def _output_update(with_usage: bool) -> Any:
    values: dict[str, Any] = {"updated_at": bindparam("p_now"),
                              "output_text": responses.c.output_text + bindparam("p_text")}
    if with_usage:
        values.update(input_tokens=bindparam("p_in"), output_tokens=bindparam("p_out"))
    return (update(responses).where(responses.c.task_id == bindparam("p_task_id"))
            .values(**values))


# Prepared once (see `transitions.Held`): appending output is the worker's hottest write.
_ADD_OUTPUT = {with_usage: _output_update(with_usage) for with_usage in (False, True)}


@dataclass(frozen=True)
class Completion:
    """One generation that ended, for `complete_all`: the task, its owner token, the
    closing item/part events, the final usage, the output not yet stored (the last deltas
    ride in `closing`) and whether the `loading -> running` move is still to be made."""

    task_id: str
    owner: str
    closing: Sequence[Event]
    usage: Usage
    text: str = ""
    start: bool = False


def complete(
    db: Database, task_id: str, owner: str, closing: Sequence[Event], *, usage: Usage,
    text: str = "",
    start: bool = False,
) -> None:
    """`running -> completed` with the closing item/part events and the terminal one:
    `complete_all` of one task, raising its failure."""
    [failure] = complete_all(db, [Completion(task_id, owner, closing, usage, text, start)])
    if failure is not None:
        raise failure


def complete_all(db: Database, completions: Sequence[Completion]) -> list[Exception | None]:
    """`running -> completed` for many tasks in ONE transaction; per task, None or why
    its fenced write changed nothing (`CancelRequested`, `LeaseLost`).

    Each task's write is fenced on its own: one that lost its lease or is being
    cancelled changes nothing, and the others still complete. Set-based: one UPDATE for
    the pending starts, one per distinct closing-event count (normally one), one events
    insert each, one executemany for the output. With `start=True` a whole short
    generation (`loading -> running -> completed`, each move with its event) costs no
    transaction of its own.
    """
    if not completions:
        return []
    failures: dict[int, Exception] = {}
    with db.write() as conn:
        now = db.clock.now_ms()
        for batch in _rounds(completions):
            _complete_batch(conn, now, batch, failures)
    return [failures.get(i) for i in range(len(completions))]


def _rounds(completions: Sequence[Completion]) -> Iterator[dict[int, Completion]]:
    """The completions (by index) in rounds naming each task once (see `Held`): a stale
    and a fresh attempt of one task may end together; the stale one then finds it gone."""
    left = dict(enumerate(completions))
    while left:
        batch: dict[int, Completion] = {}
        ids: set[str] = set()
        for i, c in left.items():
            if c.task_id not in ids:
                ids.add(c.task_id)
                batch[i] = c
        yield batch
        left = {i: c for i, c in left.items() if i not in batch}


def _complete_batch(
    conn: Connection, now: int, batch: dict[int, Completion], failures: dict[int, Exception]
) -> None:
    starting = {i: c for i, c in batch.items() if c.start}
    if starting:
        _fail_unmoved(conn, starting, _start_all(conn, now, _held_by(starting)), failures)
    running = {i: c for i, c in batch.items() if i not in failures}
    for group in _by_event_count(running):
        finished = move(conn, now=now, expected={Status.RUNNING}, where=_held_by(group),
                        to=Status.COMPLETED, events=_closing_events(group),
                        values=_finished(now))
        _fail_unmoved(conn, group, finished, failures)
    outputs = [c for i, c in running.items() if i not in failures]
    if outputs:
        conn.execute(_ADD_OUTPUT[True], [_output_params(c.task_id, now, c.text, c.usage)
                                         for c in outputs])


def _held_by(completions: dict[int, Completion]) -> Held:
    return Held(tuple((c.task_id, c.owner) for c in completions.values()))


def _by_event_count(completions: dict[int, Completion]) -> list[dict[int, Completion]]:
    """`move` bumps `last_seq` by one count per statement: one group per closing length."""
    groups: dict[int, dict[int, Completion]] = {}
    for i, c in completions.items():
        groups.setdefault(len(c.closing), {})[i] = c
    return list(groups.values())


def _closing_events(group: dict[int, Completion]) -> EventsFor:
    closing = {c.task_id: [*c.closing, Event("response.completed")] for c in group.values()}
    return per_row(len(next(iter(closing.values()))))(lambda row: closing[row.id])


def _fail_unmoved(
    conn: Connection, tried: dict[int, Completion], moved: list[Row[Any]],
    failures: dict[int, Exception],
) -> None:
    done = {row.id for row in moved}
    for i, c in tried.items():
        if c.task_id not in done:
            failures[i] = fenced(conn, c.task_id, c.owner)


def _finished(now: int) -> dict[str, Any]:
    return {"finished_at": now, "owner_token": None, "lease_expires_at": None}


def fail(db: Database, task_id: str, owner: str, code: str, message: str) -> None:
    """A non-retryable failure: `failed` at once, not a dead letter."""
    with db.write() as conn:
        now = db.clock.now_ms()
        error = {"code": code, "message": message[:500]}
        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held.one(task_id, owner), to=Status.FAILED,
                    events=[Event("response.failed", {"error": error, "dead_lettered": False})],
                    values={**_finished(now), "error_code": code,
                            "error_message": error["message"]}):
            raise fenced(conn, task_id, owner)


def finish_cancelled(db: Database, task_id: str, owner: str) -> None:
    """The worker honours a cancel request: `cancelling -> cancelled`."""
    with db.write() as conn:
        now = db.clock.now_ms()
        if not move(conn, now=now, expected={Status.CANCELLING}, where=Held.one(task_id, owner),
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
        if owned is None or Status(owned.status) not in active or not dead_letter(
                conn, now, Held.one(task_id, owner), expected=Status(owned.status)):
            raise fenced(conn, task_id, owner)
        return False


def release(db: Database, task_id: str, owner: str) -> None:
    """Graceful stop: hand the task back, refunding the attempt.

    A `resume` task that was running stays `running` with its snapshot and no lease,
    so the next claim continues it; anything else goes back to `queued`.
    """
    with db.write() as conn:
        now = db.clock.now_ms()
        refund = {"owner_token": None, "lease_expires_at": None, "attempts": Add(-1)}
        if move(conn, now=now, expected={Status.RUNNING},
                where=[*_mine(task_id, owner), tasks.c.on_restart == OnRestart.RESUME.value],
                to=Status.RUNNING, events=[], values=refund):
            return

        @per_row(1)
        def released(row: Row[Any]) -> list[Event]:
            return [Event("response.queued", {"reason": "released", "attempt": row.attempts,
                                              "run_at": now})]

        if not move(conn, now=now, expected={Status.LOADING, Status.RUNNING},
                    where=Held.one(task_id, owner), to=Status.QUEUED, events=released,
                    values={**refund, "run_at": now}):
            raise fenced(conn, task_id, owner)


def reset_output(conn: Connection, ids: Sequence[str], now: int) -> None:
    """A task that starts over starts with empty output and usage.

    Done when a queued task is claimed, so requeue, release and recovery (which can
    touch 100,000 tasks at once) never have to rewrite response rows. A task's first
    claim finds its response empty already and rewrites nothing."""
    conn.execute(_RESET_OUTPUT, {"p_ids": list(ids), "p_now": now})


_RESET_OUTPUT = (
    update(responses)
    .where(responses.c.task_id.in_(bindparam("p_ids", expanding=True)),
           (responses.c.output_text != "") | (responses.c.input_tokens != 0)
           | (responses.c.output_tokens != 0))
    .values(output_text="", input_tokens=0, output_tokens=0, updated_at=bindparam("p_now"))
)
