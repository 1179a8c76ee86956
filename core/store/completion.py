"""Completing attempts: `running -> completed` for many tasks in one transaction.

A sweeper's generations often end together (short tasks, many slots); completing them
in one set-based transaction is what lets one sweeper finish hundreds of tasks a
second (`scheduler/group_commit.py` gathers them). Each task is still fenced on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Connection, Row, select
from sqlalchemy.exc import DBAPIError

from core.engines.base import Usage
from core.states import Status
from core.store.database import Database
from core.store.outage import is_row_held
from core.store.pg_completion import complete_alone
from core.store.redo_dropped import Answer, Landing, write_through_drops
from core.store.transitions import Event, Held, PerRow, insert_events, move
from core.store.worker_writes import (
    add_outputs,
    each_apart,
    fenced,
    start_all,
    terminal_values,
    unless_held,
    wait_briefly,
)
from core.tables import tasks


@dataclass(frozen=True)
class Completion:
    """One generation that ended, for `complete_all`: the task, its owner token, the
    closing item/part events, the final usage, the output not yet stored (the last deltas
    ride in `closing`) and whether the `loading -> running` move is still to be made.
    `attempt`: the attempt's number (`Claim.attempt`), which tells its completion that
    landed from another attempt's after a dropped connection (`_completion_landed`);
    None: not known, and a drop is raised as it is."""

    task_id: str
    owner: str
    closing: Sequence[Event]
    usage: Usage
    text: str = ""
    start: bool = False
    attempt: int | None = None


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
    the pending starts, one per distinct closing-event count (normally one), ONE events
    insert for all of them (a round trip each on PostgreSQL), one executemany for the
    output; on PostgreSQL all of that is one statement (`core.store.pg_completion`),
    its own transaction (a task named twice, which `_rounds` splits, makes two).
    With `start=True` a whole short generation (`loading -> running -> completed`, each
    move with its event) costs no transaction of its own. After a dropped connection
    the completions that did not land are written again (`_completion_landed`).

    A round that met a row another transaction holds past the process's bound
    (`is_row_held`: PostgreSQL's `lock_timeout`, `core.store.connect`) is written
    again completion by completion (`complete_apart`), so that only the held tasks'
    completions fail, each answered with the held row's error; the others complete.
    """
    told = all(c.attempt is not None for c in completions)
    return write_through_drops(db, completions, partial(_complete_all, db),
                               _completion_landed if told else None)


def complete_apart(db: Database, c: Completion) -> Exception | None:
    """One completion in a transaction of its own that waits only briefly for a row
    another transaction holds (`worker_writes.wait_briefly`): None once written, or
    why its fence did not hold; a store's error, the held row's (`is_row_held`) among
    them, is raised (`worker_writes.answered_alone` answers it). Its moves are
    `_complete_batch`'s, SQLite's, as the one statement of `core.store.pg_completion`
    commits by itself."""
    [answer] = write_through_drops(db, [c], partial(_complete_briefly, db),
                                   None if c.attempt is None else _completion_landed)
    return answer


def _complete_briefly(db: Database, completions: Sequence[Completion]) -> list[Answer]:
    failures: dict[int, Exception] = {}
    with db.write_events() as conn:
        wait_briefly(conn)
        _complete_batch(conn, db.clock.now_ms(), dict(enumerate(completions)), failures)
    return [failures.get(i) for i in range(len(completions))]


def _completion_landed(conn: Connection, c: Completion) -> Answer | Landing:
    """A completion landed once the task is `completed` by this attempt: the completion
    clears the owner token, but another attempt's would have counted one attempt more
    (a claim counts each; only the owner's own release gives one back). It did not land
    while its owner still holds the task as the completion expected it."""
    row = conn.execute(select(tasks.c.status, tasks.c.owner_token, tasks.c.attempts)
                       .where(tasks.c.id == c.task_id)).first()
    if row is not None and row.status == Status.COMPLETED and row.attempts == c.attempt:
        return None
    return unless_held(conn, c.task_id, c.owner, row,
                       {Status.LOADING if c.start else Status.RUNNING})


def _complete_all(db: Database, completions: Sequence[Completion]) -> list[Answer]:
    if not completions:
        return []
    failures: dict[int, Exception] = {}
    if db.data_modifying_ctes:
        for batch in _rounds(completions):
            _complete_alone(db, batch, failures)
    else:
        with db.write_events() as conn:
            now = db.clock.now_ms()
            for batch in _rounds(completions):
                _complete_batch(conn, now, batch, failures)
    return [failures.get(i) for i in range(len(completions))]


def _complete_alone(db: Database, batch: dict[int, Completion],
                    failures: dict[int, Exception]) -> None:
    """One round on PostgreSQL: its one statement commits by itself
    (`core.store.pg_completion.complete_alone`), then this process hears the events.
    Why a task was not moved is read afterwards, as the separate moves read it (a
    later statement of READ COMMITTED either way); if that read fails, the round's
    completions stand and the failure is the group's, as any store error is. A round
    that met a held row committed nothing: each of it is completed apart."""
    try:
        moved = complete_alone(db, list(batch.values()))
    except DBAPIError as exc:
        if not is_row_held(exc):
            raise
        apart = each_apart(exc, list(batch.values()), partial(complete_apart, db))
        failures.update((i, failure) for i, failure in zip(batch, apart) if failure is not None)
        return
    db.announce_committed_events(c.task_id for c in batch.values())
    unmoved = {i: c for i, c in batch.items() if c.task_id not in moved}
    if unmoved:
        with db.read() as conn:
            _fail_unmoved(conn, unmoved, moved, failures)


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
    events: list[dict[str, Any]] = []  # every move's events, inserted at once below
    starting = {i: c for i, c in batch.items() if c.start}
    if starting:
        started = start_all(conn, now, _held_by(starting), event_rows=events)
        _fail_unmoved(conn, starting, started, failures)
    running = {i: c for i, c in batch.items() if i not in failures}
    for group in _by_event_count(running):
        finished = move(conn, now=now, expected={Status.RUNNING}, where=_held_by(group),
                        to=Status.COMPLETED, events=_closing_events(group),
                        values=terminal_values(now), event_rows=events)
        _fail_unmoved(conn, group, finished, failures)
    insert_events(conn, events)
    outputs = [c for i, c in running.items() if i not in failures]
    if outputs:
        add_outputs(conn, now, [(c.task_id, c.text, c.usage) for c in outputs])


def _held_by(completions: dict[int, Completion]) -> Held:
    return Held(tuple((c.task_id, c.owner) for c in completions.values()))


def _by_event_count(completions: dict[int, Completion]) -> list[dict[int, Completion]]:
    """`move` bumps `last_seq` by one count per statement: one group per closing length."""
    groups: dict[int, dict[int, Completion]] = {}
    for i, c in completions.items():
        groups.setdefault(len(c.closing), {})[i] = c
    return list(groups.values())


def _closing_events(group: dict[int, Completion]) -> PerRow:
    closing = {c.task_id: [*c.closing, Event("response.completed")] for c in group.values()}
    return PerRow(len(next(iter(closing.values()))), lambda row: closing[row.id])


def _fail_unmoved(
    conn: Connection, tried: dict[int, Completion], moved: list[Row[Any]] | set[str],
    failures: dict[int, Exception],
) -> None:
    done = moved if isinstance(moved, set) else {row.id for row in moved}
    for i, c in tried.items():
        if c.task_id not in done:
            failures[i] = fenced(conn, c.task_id, c.owner)
