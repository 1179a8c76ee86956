"""How a background loop logs a call that fails again and again while the store is down.

The claimer, the maintenance timer, the LISTEN connection and the API's live tail each
retry on their own every second or so. Logged at every failure, with its traceback, an
hour-long PostgreSQL outage wrote thousands of identical tracebacks per process (a
20-second outage: 1,400 lines from one sweeper) and buried the line that said when it
began. A streak logs its first failure with the traceback (it may be a bug, not an
outage), then a one-line reminder every `every` failures in a row, and one line when
the call succeeds again.
"""

from __future__ import annotations

import logging

# At one failure a second, a reminder about once a minute. Read when a streak is made.
FAILURES_PER_REMINDER = 60


class FailureStreak:
    """The failures in a row of one recurring call, and what of them is logged.

    `failed_message` takes the exception's class name and the count in a row
    (`%s`, `%d`); `back_message` the count of failed attempts before the success.
    Each streak belongs to one thread (the loop that makes the call)."""

    def __init__(self, log: logging.Logger, failed_message: str, back_message: str, *,
                 level: int = logging.WARNING) -> None:
        self._log = log
        self._failed_message = failed_message
        self._back_message = back_message
        self._level = level
        self._every = FAILURES_PER_REMINDER
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
