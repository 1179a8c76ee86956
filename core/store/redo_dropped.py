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

An API request's store call (`redone_if_dropped_before_commit`) has no landing to
read: it is made once more, at once, only when the drop came before it sent any
COMMIT (`core.store.database.commits_begun`), as the server then rolled back all it
had done; a drop at a COMMIT is its caller's to answer. The one exception is the
group commit's births statement (`core.store.new_tasks`): its task ids are made
before it is sent, so their rows tell what landed, and it goes through here.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from core.store.database import Database, commits_begun
from core.store.outage import is_connection_dropped, is_connection_lost

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
WriteAll = Callable[[Sequence[W]], Sequence[R | Exception]]
# How one item's landing shows, read in a transaction of its own after a drop.
Landed = Callable[[Connection, W], R | Exception | Landing]


def write_through_drops(
    db: Database, items: Sequence[W], write_all: WriteAll[W, R], landed: Landed[W, R] | None,
    *, dropped: bool = False,
) -> list[R | Exception]:
    """`write_all(items)`, each item's answer; after a dropped connection, the items not
    `landed` are written again (`landed` None: the write cannot tell, the drop is
    raised as it is). The drop is raised after the last try, or as soon as another error
    comes. `dropped`: the caller made the first try itself, where this cannot make it
    (on the event loop: `core.store.new_tasks.enqueue_many_async`), and it met a
    connection lost once made (`is_connection_dropped`); the tries start with the read of
    what landed, so `landed` must be given."""
    assert landed is not None or not dropped
    answers: dict[int, R | Exception] = {}
    left = list(range(len(items)))
    made = int(dropped)  # the tries made before this call

    def write(tried: int) -> list[R | Exception]:
        nonlocal left
        if tried:
            left = _not_landed(db, items, left, landed, answers)
        if left or not tried:
            answers.update(zip(left, write_all([items[i] for i in left]), strict=True))
        return [answers[i] for i in range(len(items))]

    # The first try at once; the redos only where each item's landing can be read.
    pauses = (0.0, *(TRY_PAUSES_SECONDS if landed is not None else ()))
    return _tried_apart(pauses[made:], lambda tried: write(made + tried))


def read_after_drop(db: Database, read: Callable[[Connection], T]) -> T:
    """`read(conn)` in a read transaction of its own, after each pause of the tries in
    turn until one is not dropped: how a write whose connection dropped, and that cannot
    be redone item by item (a claim, `core.store.claims`), finds out what landed. The
    drop is raised after the last try, or any other error at once."""

    def read_fresh(_tried: int) -> T:
        with db.read() as conn:
            return read(conn)

    return _tried_apart(TRY_PAUSES_SECONDS, read_fresh)


def redone_if_dropped_before_commit(
    call: Callable[[], T], heard: Callable[[DBAPIError], None]
) -> T:
    """`call()`, made once more at once when the store dropped its connection under it
    (`is_connection_dropped`: an administrator's `pg_terminate_backend`, a pooler's
    restart) before it sent any COMMIT (`commits_begun`): the server rolled back what
    it had done, and a fresh connection will most likely work. `heard(drop)` is told
    before the second call. A drop at or after a COMMIT is raised as it is: that commit
    may have landed with only its acknowledgement lost, and nothing here can read
    whether it did. So are a second drop and any other error."""
    begun = commits_begun()
    return _once_more_if_dropped(call, heard, lambda: commits_begun() == begun)


def redone_if_dropped(call: Callable[[], T], heard: Callable[[DBAPIError], None]) -> T:
    """`redone_if_dropped_before_commit` for a call that is safe to make again even
    where a commit of its first landed with only its acknowledgement lost (each of
    `taskward run`'s start-up steps): made once more after a drop wherever it came."""
    return _once_more_if_dropped(call, heard, lambda: True)


def _once_more_if_dropped(call: Callable[[], T], heard: Callable[[DBAPIError], None],
                          may_redo: Callable[[], bool]) -> T:
    def redone(exc: DBAPIError) -> bool:
        if not is_connection_dropped(exc) or not may_redo():
            return False
        heard(exc)
        return True

    return _tried_apart((0.0, 0.0), lambda _tried: call(), redone)


def _tried_apart(
    pauses: Sequence[float], attempt: Callable[[int], T],
    redone: Callable[[DBAPIError], bool] = is_connection_lost,
) -> T:
    """`attempt(tried)`, the tries counted from 0, after each of `pauses` in turn (a zero
    one: at once) until one is not dropped (`redone`: a lost connection, unless the
    caller's drops are fewer). The one rule of every store call redone through a drop:
    a fresh connection may well work after a pause, so a drop is tried again until the
    last try, which raises it; any other error is no drop's and is raised at once."""
    for tried, pause in enumerate(pauses):
        if pause:  # a zero sleep still yields the GIL
            time.sleep(pause)
        try:
            return attempt(tried)
        except DBAPIError as exc:
            if tried == len(pauses) - 1 or not redone(exc):
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
