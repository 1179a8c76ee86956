"""Group commit: attempts of one worker process that end together share a transaction.

A short task's whole life after its claim is one `complete` transaction, so with many
slots the commits, not the work, bound throughput. The first attempt to arrive leads a
group: while other attempts still run, it waits for them to join, at most
`gather_seconds` in all and no longer than `quiet_seconds` without anyone joining (an
attempt in the middle of a long generation does not hold it up). It then writes every
completion waiting in one transaction, and whoever arrives during the write joins the
next group, which the same leader gathers and writes. No thread is added, and each
item keeps its own outcome: the store fences every task of a group on its own.

A worker's members do not wait for their group: they hand a `written` callback with
their item and go on, and the leader settles each member once its group is written.
Waiting cost each member a wake-up at the end of the write (and, before each group had
its own condition, ~0.5 more per task; issue 15): a draining sweeper's engine threads
slept twice per no-op task, once for their next attempt and once for this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
WriteAll = Callable[[Sequence[T]], Sequence[BaseException | None]]


def gather(
    condition: threading.Condition,
    changed_at: Callable[[], float],
    enough: Callable[[], bool],
    *,
    gather_seconds: float,
    quiet_seconds: float,
) -> None:
    """With `condition` held, wait until `enough()`: at most `gather_seconds` in all and
    never `quiet_seconds` past the latest change (`changed_at()`, a `time.monotonic`
    stamp; the wait's start counts as one). What comes together is gathered; what is
    far off is not waited for.

    Whoever changes what is gathered stamps the change and notifies `condition` only
    when it may be `enough()`: the waiter sleeps until the quiet time after the latest
    stamp instead of waking at every change (a wake-up per task, measured as a
    tenth of a no-op task's CPU in a draining sweeper, issue 15)."""
    start = time.monotonic()
    deadline = start + gather_seconds
    while not enough():
        left = min(deadline, max(changed_at(), start) + quiet_seconds) - time.monotonic()
        if left <= 0:
            return
        condition.wait(left)


class GroupWriteFailed(Exception):
    """The group's write raised (a database outage, say): every member sees this, the
    write's own error as its cause."""


Written = Callable[[BaseException | None], None]


def write_failed(cause: BaseException) -> GroupWriteFailed:
    """One member's failure when its group's write raised: each its own instance, as
    each may be raised on a thread of its own."""
    failed = GroupWriteFailed(f"the group write failed: {cause!r}")
    failed.__cause__ = cause
    return failed


class _Ticket(Generic[T]):
    def __init__(self, item: T, written: Written | None, group: threading.Condition) -> None:
        self.item = item
        self.written = written  # called once its group is written; None: its submit waits
        self.group = group  # its group's: notified when that group is written
        self.done = False
        self.failure: BaseException | None = None


class GroupCommit(Generic[T]):
    def __init__(
        self,
        write_all: WriteAll[T],
        *,
        running: Callable[[], int] = lambda: 1,
        gather_seconds: float = 0.0,
        quiet_seconds: float = 0.0,
    ) -> None:
        """`running()` counts the attempts that may still submit or wait to be written
        (the leader's included): a leader never waits once all of them are in its group."""
        self._write_all = write_all
        self._running = running
        self._gather = gather_seconds
        self._quiet = quiet_seconds
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # the gathering leader waits here
        self._forming = threading.Condition(self._lock)  # the next group's waiters wait here
        self._waiting: list[_Ticket[T]] = []
        self._arrived_at = 0.0  # `time.monotonic` of the latest submit
        self._leading = False  # a leader is gathering or writing

    def submit(self, item: T, written: Written | None = None) -> None:
        """Write `item` with whatever else is waiting.

        Without `written`, the submit returns once the item's group is written (leading
        it when nobody leads), raising the item's own failure. With `written`, it
        returns at once: `written(failure)` (None, or the item's own failure) is called
        on the thread that wrote the group, once written, and the caller calls `lead`
        once it has nothing more to submit soon (a thread running several attempts in
        turn would otherwise gather for the next ones, which wait behind it).
        """
        with self._lock:
            ticket = _Ticket(item, written, self._forming)
            self._waiting.append(ticket)
            self._arrived_at = time.monotonic()
            if self._enough():  # else a gathering leader wakes at its quiet time
                self._arrived.notify()
        if written is not None:
            return
        self.lead()
        with self._lock:  # written by now, or by whoever led instead
            while not ticket.done:
                ticket.group.wait()
        if ticket.failure is not None:
            raise ticket.failure

    def lead(self) -> None:
        """Gather, write and settle groups until nobody waits, unless someone else leads
        (then it writes what waits). Whoever arrives during a write joins the next
        group, written by the same leader: nobody is woken to lead."""
        with self._lock:
            if self._leading or not self._waiting:
                return
            self._leading = True
            try:
                while self._waiting:
                    gather(self._arrived, lambda: self._arrived_at, self._enough,
                           gather_seconds=self._gather, quiet_seconds=self._quiet)
                    group, self._waiting = self._waiting, []
                    self._forming = threading.Condition(self._lock)  # for those from now
                    self._lock.release()
                    try:
                        self._write(group)
                    finally:
                        self._lock.acquire()
            finally:  # the next `lead` leads, even after an error here
                self._leading = False

    def _enough(self) -> bool:
        """Every attempt that may still submit is waiting (the lock held)."""
        return len(self._waiting) >= self._running()

    def _write(self, group: list[_Ticket[T]]) -> None:
        interrupted: BaseException | None = None
        try:
            failures = list(self._write_all([t.item for t in group]))
            if len(failures) != len(group):
                raise ValueError("a group write must answer for every item")
        except BaseException as exc:  # every member is settled, whatever the write raised
            failures = [write_failed(exc) for _ in group]
            if not isinstance(exc, Exception):  # an interrupt goes on up, once all are settled
                interrupted = exc
        with self._lock:
            for ticket, failure in zip(group, failures, strict=True):
                ticket.done, ticket.failure = True, failure
            group[0].group.notify_all()  # this group's waiting submits
        for ticket in group:
            if ticket.written is not None:
                try:
                    ticket.written(ticket.failure)
                except Exception:  # one member's settling must not stop the others'
                    log.exception("a completion's settling failed")
        if interrupted is not None:
            raise interrupted
