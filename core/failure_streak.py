"""How a process logs a call that fails again and again while the store is down.

The claimer, the maintenance timer, the LISTEN connection and the API's live tail each
retry on their own every second or so. Logged at every failure, with its traceback, an
hour-long PostgreSQL outage wrote thousands of identical tracebacks per process (a
20-second outage: 1,400 lines from one sweeper) and buried the line that said when it
began. A streak logs its first failure with the traceback (it may be a bug, not an
outage), then a one-line reminder every `every` failures in a row, and one line when
the call succeeds again.

A server process answers many independent requests instead, each `503` while the store
is out: a tally logs the first and then one line a minute counting the rest, where a
line per request wrote as many lines as clients retried (every second, as their
`Retry-After` asks).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

# At one failure a second, a reminder about once a minute. Read when a streak is made.
FAILURES_PER_REMINDER = 60
# A tally's reminder at most once a minute. Read when a tally is made.
SECONDS_PER_REMINDER = 60.0


class FailureStreak:
    """The failures in a row of one recurring call, and what of them is logged.

    `failed_message` takes the exception's class name and the count in a row
    (`%s`, `%d`); `back_message` the count of failed attempts before the success.
    Each streak belongs to one thread (the loop that makes the call)."""

    def __init__(self, log: logging.Logger, failed_message: str, back_message: str, *,
                 level: int = logging.WARNING, every: int | None = None) -> None:
        self._log = log
        self._failed_message = failed_message
        self._back_message = back_message
        self._level = level
        # A call retried about once a second reminds every `FAILURES_PER_REMINDER`
        # failures: a minute. One that comes far less often passes its own `every`.
        self._every = FAILURES_PER_REMINDER if every is None else every
        self._in_a_row = 0

    def failed(self, exc: BaseException) -> None:
        """Count a failure; log the first (with its traceback) and every `every`-th
        after it, at the streak's level."""
        self._in_a_row += 1
        if (self._in_a_row - 1) % self._every == 0:
            self._log.log(self._level, self._failed_message, type(exc).__name__,
                          self._in_a_row, exc_info=exc if self._in_a_row == 1 else None)

    def succeeded(self) -> None:
        """The call worked: say so if it had been failing, and start counting afresh."""
        if self._in_a_row:
            self._log.info(self._back_message, self._in_a_row)
            self._in_a_row = 0


class FailureTally:
    """The failures of many independent calls with one cause (the requests a server
    process answers while the store is out), and what of them is logged.

    No single call's success says the outage is over, so time does: the first failure
    after `SECONDS_PER_REMINDER` without one is logged as a new outage, and while they
    go on one warning per `SECONDS_PER_REMINDER` counts those since the previous line.
    `first_message` takes the exception's class name (`%s`); `reminder_message` that
    and the count (`%s`, `%d`). Each tally belongs to one thread (the event loop)."""

    def __init__(self, log: logging.Logger, first_message: str, reminder_message: str, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._first_message = first_message
        self._reminder_message = reminder_message
        self._clock = clock
        self._every = SECONDS_PER_REMINDER
        self._last_failure_at = -math.inf
        self._line_at = -math.inf
        self._since_line = 0

    def failed(self, exc: BaseException) -> None:
        """Count a failure; log it if it begins an outage or a reminder is due."""
        now = self._clock()
        self._since_line += 1
        if now - self._last_failure_at >= self._every:
            self._log.warning(self._first_message, type(exc).__name__)
            self._line_at, self._since_line = now, 0
        elif now - self._line_at >= self._every:
            self._log.warning(self._reminder_message, type(exc).__name__, self._since_line)
            self._line_at, self._since_line = now, 0
        self._last_failure_at = now
