"""Group commit: attempts of one worker process that end together share a transaction.

A short task's whole life after its claim is one `complete` transaction, so with many
slots the commits, not the work, bound throughput. The first runner to arrive leads a
group: while other attempts still run, it waits for them to join, at most
`gather_seconds` in all and no longer than `quiet_seconds` without anyone joining (an
attempt in the middle of a long generation does not hold it up). It then writes every
completion waiting in one transaction; the others wait for its answer, and whoever
arrives during the write joins the next group. No thread is added, and each item keeps
its own outcome: the store fences every task of a group on its own.

Each group has its own condition to wait on, made when the group starts forming: the
end of a write wakes that group's members and one waiter of the next group (to lead
it), not everyone. With one condition for all, every completion that arrived during a
write woke at its end, and all but the new leader went back to sleep (~0.5 wake-ups
per task more than needed in a draining sweeper, issue 15).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

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
    """The group's write raised (a database outage, say): every other member sees this."""


class _Ticket(Generic[T]):
    def __init__(self, item: T, written: threading.Condition) -> None:
        self.item = item
        self.written = written  # its group's: notified when that group is written
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
        """`running()` counts the attempts that may still submit (the leader included):
        a leader never waits once all of them are in its group."""
        self._write_all = write_all
        self._running = running
        self._gather = gather_seconds
        self._quiet = quiet_seconds
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # the gathering leader waits here
        self._forming = threading.Condition(self._lock)  # the next group's members wait here
        self._waiting: list[_Ticket[T]] = []
        self._arrived_at = 0.0  # `time.monotonic` of the latest submit
        self._leading = False  # a leader is gathering or writing

    def submit(self, item: T) -> None:
        """Write `item` with whatever else is waiting; raises the item's own failure."""
        with self._lock:
            ticket = _Ticket(item, self._forming)
            self._waiting.append(ticket)
            self._arrived_at = time.monotonic()
            if self._enough():  # else a gathering leader wakes at its quiet time
                self._arrived.notify()
            while self._leading and not ticket.done:
                ticket.written.wait()
            group = None if ticket.done else self._gather_group()
        if group is not None:
            self._lead(group, ticket)
        if ticket.failure is not None:
            raise ticket.failure

    def _gather_group(self) -> list[_Ticket[T]]:
        self._leading = True
        gather(self._arrived, lambda: self._arrived_at, self._enough,
               gather_seconds=self._gather, quiet_seconds=self._quiet)
        group, self._waiting = self._waiting, []
        self._forming = threading.Condition(self._lock)  # for those arriving from now
        return group

    def _enough(self) -> bool:
        """Every attempt that may still submit is waiting (the lock held)."""
        return len(self._waiting) >= self._running()

    def _lead(self, group: list[_Ticket[T]], leader: _Ticket[T]) -> None:
        failures: list[BaseException | None] = []
        try:
            failures = list(self._write_all([t.item for t in group]))
            if len(failures) != len(group):
                raise ValueError("a group write must answer for every item")
        except BaseException as exc:
            # The original goes up the leader's stack; each member gets its own error.
            failures = [None if t is leader else GroupWriteFailed(f"the group write failed: "
                                                                  f"{exc!r}") for t in group]
            raise
        finally:
            with self._lock:
                for ticket, failure in zip(group, failures, strict=True):
                    ticket.done, ticket.failure = True, failure
                self._leading = False
                leader.written.notify_all()  # this group's members
                if self._waiting:  # one of the next group's, to lead it
                    self._forming.notify()
