"""The long-running sweeper: continuous claiming plus maintenance passes on a cron timer.

Claiming runs on its own thread and sleeps on one wake-up event, so a new task starts
within milliseconds of its commit. What sets it before the next poll:

- PostgreSQL: `Database.listener`, a LISTEN on `WORK_CHANNEL`; `enqueue` NOTIFYs on
  commit, so every sweeper on every machine hears within milliseconds.
- Same process as the API (`taskward run`): `Database.listen`, called after the
  announcing transaction commits — the only push SQLite has.
- A freed slot; the end of an upstream cool-down that held a claim back
  (`Workers.idle_wait`); otherwise the poll timeout (`TASKWARD_POLL_INTERVAL_MS`). Tasks
  that become due later (`run_at`, retry backoff) announce nothing, so the loop still polls,
  just less often when a push source exists.

Cancels need no push: the lease keeper asks the store at each tick
(`scheduler.heartbeat`).

Maintenance (expired leases, orphaned cancels, schedules, retention) runs on a second
thread at the times `TASKWARD_SWEEP_SCHEDULE` names, and once at start so leftovers of a
crash are picked up at once. That start's pass waits until a claim first takes all
that is due (of a kind with no free slot, a claim says nothing), i.e. until the
work queued before the start is claimed, but no longer than
`_START_PASS_LATEST_SECONDS`: run at once, its queries, its imports and
its share of the GIL landed in the first 200 ms of a drain, while both sweepers of
`bench.peers` were still ramping up (~5 % of a 10,000-task drain's span, issue 15).
Leftovers wait no longer for it than the backlog's own tasks wait for slots anyway.

`start` claims first: the claimer's first claim goes before the listener connects and
before the start's maintenance pass (whose modules are imported only then), so work
already queued when a sweeper starts does not wait for either (issue 15: that pass and
the LISTEN connection shared the GIL with the first claim). What the claimed attempts
run with (`scheduler.execute`: the stored request's decoder, completion) is imported
once that claim has taken work, not before it (`Workers.claim`). Nothing is lost by the
order: the listener wakes the claimer once it listens, for whatever was announced
before, and maintenance never was ordered before claiming (they run on two threads).

`stop` is the graceful stop of docs/operations.md: no new claims, running attempts drain
until `TASKWARD_DRAIN_SECONDS` (or until a second signal), what is left is handed back.
Every thread started here is joined there.
"""

from __future__ import annotations

import logging
import threading

from core.failure_streak import FailureStreak
from core.settings import Settings
from core.store.database import WORK_CHANNEL, Database
from core.store.outage import drop_said, is_connection_dropped
from core.thread_names import named_thread
from scheduler.timer import MaintenanceTimer
from scheduler.workers import Workers

log = logging.getLogger(__name__)

_PUSHED_POLL_SECONDS = 1.0  # with push wake-ups, polling only finds `run_at` arrivals
_ERROR_PAUSE_SECONDS = 1.0
# How long `start` waits for the first claim before starting the rest anyway (a store
# that does not answer must not hold maintenance back for long).
_FIRST_CLAIM_WAIT_SECONDS = 1.0
# The latest the start's maintenance pass waits for the claimer to find nothing more to
# start (a backlog queued before the start); far below a cron slot's minute.
_START_PASS_LATEST_SECONDS = 5.0


class SweeperLoop:
    def __init__(
        self, db: Database, settings: Settings, *, in_process_wakeups: bool = False
    ) -> None:
        self._db = db
        self._settings = settings
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._first_claim = threading.Event()  # set once the first claim has returned
        self._caught_up = threading.Event()  # set once a claim took all that was due (or failed)
        self._workers: Workers | None = None
        announced = {WORK_CHANNEL: lambda _payload: self._wake.set()}
        self._listener = db.listener(announced)
        self._unlisten = (db.listen(WORK_CHANNEL, announced[WORK_CHANNEL])
                          if in_process_wakeups else lambda: None)
        pushed = in_process_wakeups or self._listener is not None
        poll = settings.poll_interval_ms / 1000
        self._idle_wait = max(poll, _PUSHED_POLL_SECONDS) if pushed else poll
        self._maintenance = MaintenanceTimer(settings.sweep_schedule, db.clock, self._maintain,
                                             start_gate=self._caught_up_for_the_start_pass)
        self._claimer = named_thread(self._claim_loop, "claimer")

    def start(self) -> None:
        self._workers = Workers(self._db, self._settings, on_slot_freed=self._wake.set)
        self._claimer.start()
        self._first_claim.wait(_FIRST_CLAIM_WAIT_SECONDS)
        if self._listener is not None:
            self._listener.start()
        self._maintenance.start()

    def stop(self, *, hurry: threading.Event | None = None) -> None:
        """Graceful stop, its drain cut short once `hurry` is set; returns once every
        thread of the loop has ended."""
        self._stopping.set()
        self._caught_up.set()  # a start's pass still waiting gives up
        self._unlisten()
        self._wake.set()
        self._claimer.join()
        if self._listener is not None:
            self._listener.stop()
        self._maintenance.stop()
        if self._workers is not None:
            self._workers.stop(drain_seconds=self._settings.drain_seconds, hurry=hurry)

    def _claim_loop(self) -> None:
        assert self._workers is not None
        failures = FailureStreak(
            log, f"claim failed (%s, %d in a row); retrying every {_ERROR_PAUSE_SECONDS:.0f}s",
            "claims are back after %d failed attempts", level=logging.ERROR)
        claimed = False  # the last claim went through: a connection lost now was dropped
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                self._workers.gather_slots()
                started = self._workers.claim()
            except Exception as exc:
                if claimed and is_connection_dropped(exc):
                    claimed = False
                    log.warning("%s", drop_said("claim", "claiming again", exc))
                    continue
                failures.failed(exc)
                self._first_claim.set()
                self._caught_up.set()  # an outage does not hold maintenance back
                self._stopping.wait(_ERROR_PAUSE_SECONDS)
                continue
            claimed = True
            failures.succeeded()
            self._first_claim.set()
            if started:
                continue  # more may be due; with no free slot of either kind, no statement
            if self._workers.caught_up():  # not merely out of free slots
                self._caught_up.set()
            self._wake.wait(self._workers.idle_wait(self._idle_wait))

    def _caught_up_for_the_start_pass(self) -> bool:
        """The timer's gate before the start's pass: the claimer has caught up, or
        `_START_PASS_LATEST_SECONDS` went by; False (no pass) when the loop stops
        meanwhile."""
        self._caught_up.wait(_START_PASS_LATEST_SECONDS)
        return not self._stopping.is_set()

    def _maintain(self) -> None:
        from scheduler.sweep import maintain  # not on the first claim's path

        log.info("maintenance pass: %s", maintain(self._db, self._settings, self._stopping))
