"""The one source of time: UTC epoch milliseconds.

Every stored time comes from here, never from the database's `now()`, so that tests
can freeze and move time with freezegun (which patches `time.time`).

Times a client sends are checked at parse time (`utc_ms`): an instant that leaves the
calendar once converted to UTC (`9999-12-31T23:59:59-01:00` is year 10000) is refused
there. Rendering (`iso`) never raises, whatever number a row holds, so no stored value
can break a read.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import overload


class Clock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIRST = datetime.min.replace(tzinfo=UTC)
_LAST = datetime.max.replace(tzinfo=UTC)
MIN_MS = (_FIRST - _EPOCH) // timedelta(milliseconds=1)
MAX_MS = (_LAST - _EPOCH) // timedelta(milliseconds=1)


@overload
def iso(ms: int) -> str: ...
@overload
def iso(ms: None) -> None: ...
@overload
def iso(ms: int | None) -> str | None: ...
def iso(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds, or None; a value beyond the calendar is shown at
    its end (a read must not fail on a row, and no accepted input can hold one)."""
    if ms is None:
        return None
    moment = _EPOCH + timedelta(milliseconds=min(max(ms, MIN_MS), MAX_MS))
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_ms(moment: datetime) -> int:
    """Epoch ms of an aware datetime, exactly (no float rounding), floored.

    `ValueError` when it has no offset or lies outside years 1..9999 in UTC, so a
    validator calling it refuses the value with a 422 rather than storing it."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("needs a UTC offset (RFC 3339)")
    ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError("is outside the representable range once converted to UTC")
    return ms


def parse_iso(text: str) -> int:
    """Epoch ms of an RFC 3339 timestamp, with `utc_ms`'s checks."""
    return utc_ms(datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")))
