"""The maintenance timer: when the loop's maintenance passes run.

`TASKWARD_SWEEP_SCHEDULE` is read by `core.cron`, as schedules are, so a cron
expression means the same thing in both places (Vixie semantics, UTC).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from core.clock import Clock
from core.cron import next_slot, parse_cron
from core.failure_streak import FailureStreak
from core.store.outage import drop_said, is_connection_dropped
from core.thread_names import named_thread

log = logging.getLogger(__name__)


class MaintenanceTimer:
    """Calls `run` once at start and then at every slot of `schedule`.

    `start_gate`, when given, is called on the timer's thread before the start's pass
    and may hold it back: the timer waits for it, and ends at once (no pass at all)
    when it returns False.

    Time comes from `clock`; `poll` holds the whole decision, so tests drive it under a
    frozen clock (freezegun) without the thread, which only polls every `tick_seconds`.
    """

    def __init__(
        self, schedule: str, clock: Clock, run: Callable[[], object], *, tick_seconds: float = 1.0,
        start_gate: Callable[[], bool] | None = None,
    ) -> None:
        self._schedule = parse_cron(schedule)
        self._clock = clock
        self._run_pass = run
        self._start_gate = start_gate
        self._tick = tick_seconds
        self._due_ms: int | None = None  # None: the start pass has not run yet
        self._stop = threading.Event()
        self._thread = named_thread(self._run, "maintenance")
        # A pass is tried once a slot (a minute, by default), not once a second: every
        # failure is its own line, where one in 60 was one an hour.
        self._failures = FailureStreak(
            log, "maintenance pass failed (%s, %d in a row); retrying at the next slot",
            "maintenance passes are back after %d failed attempts", level=logging.ERROR,
            every=1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def poll(self) -> bool:
        """Run the pass if it is due; True when it ran. A pass that overran the next
        slot does not run twice: the following slot is counted from its end."""
        if self._due_ms is not None and self._clock.now_ms() < self._due_ms:
            return False
        self._pass()
        self._due_ms = next_slot(self._schedule, self._clock.now_ms())
        return True

    def _run(self) -> None:
        if self._start_gate is not None and not self._start_gate():
            return
        self.poll()
        while not self._stop.wait(self._tick):
            self.poll()

    def _pass(self) -> None:
        """Run a pass; a connection the store dropped under it (an administrator's
        `pg_terminate_backend`, a pooler's restart) is one line and the pass is run again
        at once on a fresh one, as the claimer does, not a slot (a minute) later. Its
        steps are each their own transaction and idempotent: a pass run again redoes
        only what the drop cut short."""
        try:
            try:
                self._run_pass()
            except Exception as exc:
                if not is_connection_dropped(exc):
                    raise
                log.warning("%s", drop_said("maintenance", "running the pass again", exc))
                self._run_pass()
        except Exception as exc:  # a failed pass is retried at the next slot, never fatal
            self._failures.failed(exc)
        else:
            self._failures.succeeded()
