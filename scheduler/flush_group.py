"""The output flushes of one worker's attempts, written together when due close together.

A streaming attempt writes its pending text about once per flush interval, and most of
a flush's cost is its transaction (the commit, the pooled connection, the writer's
turn), not its rows: at 8 streams that was most of the runners' CPU per token
(docs/benchmarks.md, "the eighth wave"). Each attempt tells this group when its next
time-based flush is due and how to wake it. The attempt whose flush comes first leads:
it calls the attempts due within its join window after it to flush now, early, and a
`GroupCommit` writes all of them in one transaction, each fenced on its own
(`worker_writes.append_outputs`), once they are in (at most `GATHER_SECONDS`). Those
that flushed together start their next text within one token's gap of each other, so
at the next interval they are due close together again and the first calls the rest:
streams side by side keep sharing one transaction per interval. A call replaces the
wake-up the attempt would have had for its own flush a moment later; no text waits
longer than before, some less (at most the window, `join_window_ms`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from core.clock import Clock
from core.store import worker_writes
from core.store.database import Database
from core.store.worker_writes import OutputWrite
from scheduler.group_commit import GroupCommit

# How long a leader waits for the attempts it called: each only has to wake and write
# its pending text into the group; a late one (a busy machine) leads the next group.
GATHER_SECONDS = 0.003
_QUIET_SECONDS = 0.001
_CALLED = 0  # the due time of an attempt called to flush now: due, so waited for


def join_window_ms(flush_interval_ms: int) -> int:
    """A worker's `join_ms`: half the flush interval. Streams of one upstream get their
    tokens in the same decode step, so one whose flushes fell a step behind the others'
    stays that far behind; at a quarter interval a step (26-30 ms for llama-server's 4
    streams on 2 cores) was too far to be called, and it wrote alone at every interval.
    With half, a group due later than half an interval after another calls that one at
    its own flush (the other is then due within half): any two groups merge."""
    return flush_interval_ms // 2


class FlushGroup:
    def __init__(self, db: Database, *, join_ms: int) -> None:
        """`join_ms`: how much earlier than due an attempt is called to flush with another
        (`join_window_ms` for a worker's attempts)."""
        self._db = db
        self._clock: Clock = db.clock
        self._join_ms = join_ms
        self._lock = threading.Lock()
        # Task id -> (its next time-based flush, how to call it to flush now), while
        # text waits: the runner of the attempt tells it (`due`).
        self._due: dict[str, tuple[int, Callable[[], None]]] = {}
        self._commit: GroupCommit[OutputWrite] = GroupCommit(
            self._write_all, running=self._due_now, gather_seconds=GATHER_SECONDS,
            quiet_seconds=_QUIET_SECONDS)

    def due(self, task_id: str, due_ms: int | None, call: Callable[[], None]) -> None:
        """When the attempt of `task_id` flushes next by time (None: nothing waits, or it
        is ending, so nobody waits for it), and `call()`, which makes its runner flush
        now (its `flush_called`)."""
        with self._lock:
            if due_ms is None:
                self._due.pop(task_id, None)
            else:
                self._due[task_id] = (due_ms, call)

    def write(self, write: OutputWrite, *, call_others: bool = True) -> None:
        """Write `write` now, with the flushes of the attempts due within `join_ms`,
        called to flush now (unless not `call_others`: the leader then waits only for
        those already due); raises its own failure (`worker_writes.fenced`, or
        `GroupWriteFailed` when the transaction failed)."""
        calls: list[Callable[[], None]] = []
        with self._lock:  # counted among those due, so a leader waits for it
            self._due[write.task_id] = (_CALLED, _nothing)
            if call_others:
                until = self._clock.now_ms() + self._join_ms
                for task_id, (due_ms, call) in self._due.items():
                    if _CALLED < due_ms <= until:
                        self._due[task_id] = (_CALLED, call)
                        calls.append(call)
        for call in calls:
            call()
        self._commit.submit(write)

    def called(self, task_id: str) -> bool:
        """Whether a leader called the attempt of `task_id` and waits for its flush."""
        with self._lock:
            entry = self._due.get(task_id)
            return entry is not None and entry[0] == _CALLED

    def _due_now(self) -> int:
        """How many flushes are due by now (called ones included): the group gathers
        until all are in it."""
        now = self._clock.now_ms()
        with self._lock:
            return sum(1 for due_ms, _ in self._due.values() if due_ms <= now)

    def _write_all(self, writes: Sequence[OutputWrite]) -> list[Exception | None]:
        with self._lock:  # taken: their attempts tell their next times after the write
            for write in writes:
                self._due.pop(write.task_id, None)
        return worker_writes.append_outputs(self._db, writes)


def _nothing() -> None:
    """The call of an attempt already flushing."""
