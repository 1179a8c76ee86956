"""One claimed attempt as the threads around it see it: its claim, its deadline, and
the flags other threads raise to stop it.

The runner (whoever follows its stream: in a worker, `scheduler.stream_thread`) owns
the attempt; the lease keeper raises `cancel` or `lost`, the
worker pool raises `hand_back` at shutdown, and the engine polls `should_stop`. Every
flag also drops a wake-up into the runner's inbox, so the runner reacts at once
instead of waiting for the engine's next chunk.

An attempt also fences itself: once its lease has run out while renewals fail or hang
(the store unreachable, say), it counts as lost, whichever thread notices first,
because its writes would be refused anyway and its engine is burning someone's CPU or
GPU. The deadline is counted from a time no later than the lease's real start, so it
never comes after the lease the store holds.

The execution timeout counts the attempt's execution: time its engine reports it waits
for room (the local engine's KV cells, until other attempts leave) moves the deadline
on by as much, or a task queued behind long ones would spend its attempts, one
timeout each, without a token. The lease is renewed and the flags heeded all the while.
"""

from __future__ import annotations

from enum import StrEnum

from core.clock import Clock
from core.store.claims import Claim
from scheduler.inbox import Inbox


class Outcome(StrEnum):
    """How an attempt ended; the sweep summary counts these."""

    COMPLETED = "completed"
    FAILED = "failed"
    REQUEUED = "requeued"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    RELEASED = "released"
    LOST = "lost"


class StopReason(StrEnum):
    LOST = "lost"
    CANCEL = "cancel"
    HAND_BACK = "hand_back"
    TIMEOUT = "timeout"


WAKE = object()  # an inbox item that carries nothing but "look at the flags"
RENEWAL_TICK_MS = 50  # how often a runner looks while its lease's renewal is overdue
LONGEST_SLEEP_MS = 1000  # a runner with nothing due looks at its times at least this often


class Attempt:
    def __init__(
        self, claim: Claim, *, clock: Clock, timeout_ms: int, lease_ms: int,
        leased_at_ms: int | None = None,
    ) -> None:
        self.claim = claim
        self.clock = clock
        self.deadline_ms = clock.now_ms() + timeout_ms
        self._waiting_since_ms: int | None = None  # the engine's wait for room, if any
        self.lease_ms = lease_ms
        # When the lease was last set (by the claim, then by each renewal), or earlier.
        self.renewed_at_ms = clock.now_ms() if leased_at_ms is None else leased_at_ms
        self._renewal_failed = False
        self._renewing_since_ms: int | None = None
        # When this attempt's last fenced write of output began (None: none yet): the
        # task was `running` and ours then, so a cancel made since fails its next write.
        self.wrote_at_ms: int | None = None
        self.inbox = Inbox()
        # The engine's poll between tokens, which also takes the engine's word on its
        # waits for room (`waiting`).
        self.should_stop = EnginePoll(self)
        # Raised by other threads, never waited on: a set's `add` and `in` are atomic,
        # and three `threading.Event`s (a lock and a condition each) cost more to make
        # than the rest of a no-op attempt's bookkeeping.
        self._flags: set[StopReason] = set()
        self._ended = False
        self.engine_stopped = False  # set once `should_stop` has told the engine to stop

    @property
    def task_id(self) -> str:
        return self.claim.task_id

    def raise_flag(self, reason: StopReason) -> None:
        """Ask the attempt to stop (thread-safe, idempotent)."""
        self._flags.add(reason)
        self.inbox.put(WAKE)

    def stop_reason(self) -> StopReason | None:
        """Why the attempt must stop now, most binding reason first, or None.

        A lost lease beats everything (nothing may be written any more), a lease run out
        without renewal included; a cancel beats a hand-back (the client asked for it);
        the timeout comes last.
        """
        now = self.clock.now_ms()
        if self._lease_lapsed(now):
            return StopReason.LOST
        for reason in (StopReason.LOST, StopReason.CANCEL, StopReason.HAND_BACK):
            if reason in self._flags:
                return reason
        if self._waiting_since_ms is None and now >= self.deadline_ms:
            return StopReason.TIMEOUT
        return None

    @property
    def lease_ends_ms(self) -> int:
        return self.renewed_at_ms + self.lease_ms

    def ms_until_timed_stop(self, now: int) -> int:
        """How long until `stop_reason` could change with no flag raised: at the deadline
        (which stands still while the engine waits for room), or at the lease's end (a
        lapse); past the lease's end with a renewal still under way, whose outcome
        raises no flag either, every `RENEWAL_TICK_MS`. Never more than
        `LONGEST_SLEEP_MS`: the times are the wall clock's, which may jump."""
        until_lease_end = self.lease_ends_ms - now
        if until_lease_end <= 0:
            until_lease_end = RENEWAL_TICK_MS
        until_deadline = (self.deadline_ms - now if self._waiting_since_ms is None
                          else LONGEST_SLEEP_MS)  # the deadline stands still
        return max(0, min(until_deadline, until_lease_end, LONGEST_SLEEP_MS))

    def waiting(self, waiting: bool) -> None:
        """The engine says the attempt waits for room (True) or runs (False): the
        deadline stands still while it waits. Thread-safe: the deadline moves before
        the wait is cleared, so a reader never sees the old one without the wait."""
        now = self.clock.now_ms()
        since = self._waiting_since_ms
        if waiting and since is None:
            self._waiting_since_ms = now
        elif not waiting and since is not None:
            self.deadline_ms += now - since
            self._waiting_since_ms = None

    def renewing(self, now_ms: int) -> None:
        """The lease keeper starts a renewal, or a store call its next renewal waits
        for (either may hang: the store unreachable or stalled)."""
        self._renewing_since_ms = now_ms

    def not_renewing(self) -> None:
        """The lease keeper's store calls for this attempt returned; none is under way."""
        self._renewing_since_ms = None

    def renewed(self, started_ms: int) -> None:
        """A renewal started at `started_ms` succeeded: the lease runs from then."""
        self.renewed_at_ms = started_ms
        self._renewal_failed = False
        self._renewing_since_ms = None

    def wrote(self, started_ms: int) -> None:
        """A fenced write of output begun at `started_ms` committed (`wrote_at_ms`)."""
        self.wrote_at_ms = started_ms

    def renewal_failed(self) -> None:
        self._renewal_failed = True
        self._renewing_since_ms = None

    def _lease_lapsed(self, now: int) -> bool:
        """The lease has run out and renewing it failed, or hangs since before the end.

        A lease that ran out while no renewal was tried (a clock jump) is not lapsed:
        the next renewal will tell whether the task is still held."""
        if now < self.lease_ends_ms:
            return False
        renewing = self._renewing_since_ms
        return self._renewal_failed or (renewing is not None and renewing < self.lease_ends_ms)

    def end(self) -> None:
        """The runner is done with this attempt (whatever the outcome): the engine stops."""
        self._ended = True

    def _engine_polled(self) -> bool:
        if not self._ended and self.stop_reason() is None:
            return False
        self.engine_stopped = True
        return True


class EnginePoll:
    """An attempt's `should_stop` as its engine holds it: called between tokens, and
    told of waits for room by an engine that keeps them apart
    (`core.engines.base.ExcludesWaits`)."""

    __slots__ = ("_attempt",)

    def __init__(self, attempt: Attempt) -> None:
        self._attempt = attempt

    def __call__(self) -> bool:
        return self._attempt._engine_polled()

    def waiting(self, waiting: bool) -> None:
        self._attempt.waiting(waiting)
