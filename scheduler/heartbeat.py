"""The lease keeper: one thread per worker process renewing the leases it holds.

It runs apart from every runner and engine thread, so a slow model step or a long
flush never starves a lease (the lease is also much longer than the heartbeat period).
Its answers feed back into the attempts: `cancelling` raises the cancel flag, a renewal
that changes nothing raises `lost`. At each tick (~100 ms) it also asks the store which
of its tasks a cancel has reached (one indexed read), so a cancel made anywhere (any
API process, the CLI, any machine, either store) stops an engine that has nothing to
write for a while (loading, a long prompt) at once, rather than at its next write or
heartbeat. It asks only about attempts that have not written for `WROTE_RECENTLY_MS`:
a streaming attempt's own writes, fenced on `running`, tell it of a cancel as soon.
"""

from __future__ import annotations

import logging
import threading

from core.errors import LeaseLost
from core.states import Status
from core.store import worker_writes
from core.store.database import Database
from core.store.outage import outage_cause
from core.thread_names import named_thread
from scheduler.attempt import Attempt, StopReason

log = logging.getLogger(__name__)

# An attempt whose last write of output began less than this long ago is not asked
# about: that write found the task `running`, so a cancel made since fails its next
# one, which a streaming attempt makes every flush interval (by default 100 ms, plus
# one gap between tokens). Asking about it as well cost ~0.24 CPU-ms a tick on SQLite,
# 6-8 % of the process's CPU at 8 upstream streams (docs/benchmarks.md, "Thirty-first
# wave"). An attempt that has gone quiet is asked about within this and a tick.
WROTE_RECENTLY_MS = 200


class LeaseKeeper:
    def __init__(
        self, db: Database, *, lease_ms: int, heartbeat_ms: int, tick_seconds: float = 0.1
    ) -> None:
        self._db = db
        self._lease_ms = lease_ms
        self._heartbeat_ms = heartbeat_ms
        self._tick = tick_seconds
        self._held: dict[str, Attempt] = {}
        self._failing: set[str] = set()  # tasks whose last renewal failed (logged once)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = named_thread(self._run, "lease-keeper")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """End the thread; False if it is still in a store call after `timeout` (a
        stalled store). It is a daemon thread, so it is then left to process exit, and
        the leases it held run out."""
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def hold(self, attempt: Attempt) -> None:
        with self._lock:
            self._held[attempt.task_id] = attempt
            self._db.held_here.hold(attempt.task_id)

    def drop(self, attempt: Attempt) -> None:
        with self._lock:
            if self._held.get(attempt.task_id) is attempt:
                del self._held[attempt.task_id]
                self._db.held_here.release(attempt.task_id)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            with self._lock:
                held = list(self._held.values())
            now = self._db.clock.now_ms()
            # Every store call of this tick stands between each attempt and its next
            # renewal: one that hangs (a stalled store) past a lease's end lapses it,
            # whichever call it is (`Attempt.renewing`).
            for attempt in held:
                attempt.renewing(now)
            cancelled = self._cancelled(held, now)
            due = now - self._heartbeat_ms
            for attempt in held:
                if attempt.task_id in cancelled:
                    attempt.raise_flag(StopReason.CANCEL)
                elif attempt.renewed_at_ms <= due:
                    self._renew(attempt)
                    continue
                attempt.not_renewing()

    def _cancelled(self, held: list[Attempt], now: int) -> set[str]:
        """The held tasks now `cancelling` (that state never goes back to running) among
        those whose attempts have not written within `WROTE_RECENTLY_MS` before `now`."""
        quiet = [attempt.task_id for attempt in held
                 if not _wrote_recently(attempt.wrote_at_ms, now)]
        if not quiet:
            return set()
        from core.store.tasks import cancelling_among  # not before the first claim

        try:
            return cancelling_among(self._db, quiet)
        except Exception:  # an unreachable store: the renewals report it
            return set()

    def _renew(self, attempt: Attempt) -> None:
        """One heartbeat; a database error is logged and retried on the next tick, until
        the lease runs out: then the attempt stops (it fences itself, `Attempt`)."""
        started = self._db.clock.now_ms()  # the store sets the lease from a later now
        attempt.renewing(started)
        try:
            status = worker_writes.heartbeat(self._db, attempt.task_id, attempt.claim.owner_token,
                                             lease_ms=self._lease_ms)
        except LeaseLost:
            attempt.raise_flag(StopReason.LOST)
            return
        except Exception as exc:  # the store is unreachable, or its row held: keep trying
            attempt.renewal_failed()
            if attempt.task_id not in self._failing:
                cause = outage_cause(getattr(exc, "orig", None) or exc)
                log.warning("heartbeat for task %s failed (%s%s); retrying every tick",
                            attempt.task_id, type(exc).__name__, f": {cause}" if cause else "")
                self._failing.add(attempt.task_id)
            if self._db.clock.now_ms() >= attempt.lease_ends_ms:
                log.warning("task %s: lease ran out unrenewed; stopping its generation",
                            attempt.task_id)
                attempt.raise_flag(StopReason.LOST)
            return
        self._failing.discard(attempt.task_id)
        attempt.renewed(started)
        if status is Status.CANCELLING:
            attempt.raise_flag(StopReason.CANCEL)


def _wrote_recently(wrote_at_ms: int | None, now: int) -> bool:
    """Within `WROTE_RECENTLY_MS` before `now`; a write dated after `now` (the wall
    clock stepped back) is not counted as recent, so it cannot hold off the question."""
    return wrote_at_ms is not None and now - WROTE_RECENTLY_MS < wrote_at_ms <= now
