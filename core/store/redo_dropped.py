"""A worker's writes through a dropped connection: redone on a fresh one, unless they
landed.

PostgreSQL ends a session under its client when an administrator runs
`pg_terminate_backend`, a pooler (PgBouncer) restarts or the network drops it, and the
pool's next connection works at once (`core.store.connect` replaces the dead ones).
The running attempt whose write met such a drop was abandoned: its lease ran out and
its restart policy spent another attempt, on a store that was there all along.

A write whose connection dropped may have committed with only its acknowledgement
lost; redone blindly, it would append its events twice. So each write kind states how
its landing shows in the store (`Landed`): read on a fresh connection, fenced by the
attempt's owner token, each item of the write is found landed (its answer: None, or
what the write answers for it: a requeue, whether it requeued or dead-lettered),
refused (why the fence no longer holds, as the write itself would have said:
`LeaseLost`, `CancelRequested`) or `NOT_LANDED`, and only the last are written again.
A few tries a short pause apart, far inside a lease: a store that stays away raises
its last drop, and the attempt is abandoned as before. SQLite has no session to lose
(`is_connection_lost`): its writes go through here untouched.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from core.store.database import Database
from core.store.outage import is_connection_lost

# The pauses before each try after a drop: ~1.2 s in all, far inside any lease, and
# long enough for a pooler's restart or one more `pg_terminate_backend` to pass.
TRY_PAUSES_SECONDS = (0.1, 0.3, 0.8)


class Landing(enum.Enum):
    NOT_LANDED = "not landed"  # nothing of the item is in the store: write it again


NOT_LANDED = Landing.NOT_LANDED


class Named(Protocol):
    """An item of a write: its task's id names the task whose log a landing grew."""

    @property
    def task_id(self) -> str: ...


W = TypeVar("W", bound=Named)
R = TypeVar("R")  # what a write answers for an item it wrote (most: None)
T = TypeVar("T")  # what a read answers
Answer = Exception | None  # an item's: None once written, or why its fence did not hold
WriteAll = Callable[[Sequence[W]], list[R | Exception]]
# How one item's landing shows, read in a transaction of its own after a drop.
Landed = Callable[[Connection, W], R | Exception | Landing]


def write_through_drops(
    db: Database, items: Sequence[W], write_all: WriteAll[W, R], landed: Landed[W, R] | None
) -> list[R | Exception]:
    """`write_all(items)`, each item's answer; after a dropped connection, the items not
    `landed` are written again (`landed` None: the write cannot tell, the drop is
    raised as it is). The drop is raised after the last try, or as soon as another error
    comes."""
    answers: dict[int, R | Exception] = {}
    left = list(range(len(items)))
    for tried, pause in enumerate((0.0, *TRY_PAUSES_SECONDS)):
        if pause:  # not before the first: a zero sleep still yields the GIL
            time.sleep(pause)
        try:
            if tried:
                left = _not_landed(db, items, left, landed, answers)
            if left or not tried:
                answers.update(zip(left, write_all([items[i] for i in left]), strict=True))
            return [answers[i] for i in range(len(items))]
        except DBAPIError as exc:
            if landed is None or tried == len(TRY_PAUSES_SECONDS) or not is_connection_lost(exc):
                raise
    raise AssertionError("unreachable: the last try returns or raises")


def read_after_drop(db: Database, read: Callable[[Connection], T]) -> T:
    """`read(conn)` in a read transaction of its own, after each pause of the tries in
    turn until one is not dropped: how a write whose connection dropped, and that cannot
    be redone item by item (a claim, `core.store.claims`), finds out what landed. The
    drop is raised after the last try, or any other error at once."""
    for tried, pause in enumerate(TRY_PAUSES_SECONDS, start=1):
        time.sleep(pause)
        try:
            with db.read() as conn:
                return read(conn)
        except DBAPIError as exc:
            if tried == len(TRY_PAUSES_SECONDS) or not is_connection_lost(exc):
                raise
    raise AssertionError("unreachable: the last try returns or raises")


def _not_landed(
    db: Database, items: Sequence[W], left: list[int], landed: Landed[W, R] | None,
    answers: dict[int, R | Exception],
) -> list[int]:
    """Of the items `left`, those that did not land; the others' answers go to
    `answers`. Those that landed are announced to this process's listeners as any
    commit's are (`Database.write_events`), naming no rows: the lost acknowledgement
    took those, so a live stream reads the log."""
    assert landed is not None
    with db.read() as conn:
        found = {i: landed(conn, items[i]) for i in left}
    db.announce_committed_events(items[i].task_id for i, answer in found.items()
                                 if not isinstance(answer, Exception | Landing))
    answers.update({i: answer for i, answer in found.items() if not isinstance(answer, Landing)})
    return [i for i, answer in found.items() if answer is NOT_LANDED]
