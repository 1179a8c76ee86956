"""The one source of time: UTC epoch milliseconds.

Every stored time comes from here, never from the database's `now()`, so that tests
can freeze and move time with freezegun (which patches `time.time`).

Times a client sends are read here and only here (`parse_time`), held to RFC 3339's
grammar, and checked at parse time (`utc_ms`): an instant that leaves the calendar once
converted to UTC (`9999-12-31T23:59:59-01:00` is year 10000) is refused there.
Rendering (`iso`) never raises, whatever number a row holds, so no stored value can
break a read.
"""

from __future__ import annotations

import re
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


# RFC 3339 section 5.6 `date-time`, to the letter: seconds are required, a fraction
# follows a dot (any number of digits), the offset is `Z` or ±HH:MM with its colon.
# Lower-case `t` and `z` (its ABNF is case-insensitive) and a space for the `T` (its
# note on readability) are read too, as they always were; ISO 8601's other forms
# (`+0100`, `10:20Z`, `,5`, a week date) are not, whatever a lenient parser makes of
# them. A leap second (`:60`) is refused: no datetime holds it.
_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]"
    r"(?P<time>(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?)"
    r"(?P<offset>[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")


def parse_time(text: str) -> datetime:
    """The aware datetime of an RFC 3339 time a client sent, with `utc_ms`'s checks.

    `ValueError` (a 422 from a validator) for anything else; its message never repeats
    the text. A fraction finer than microseconds is cut off, as `utc_ms` floors."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError("must be an RFC 3339 time with an offset")
    offset = "+00:00" if match["offset"] in ("Z", "z") else match["offset"]
    # Only the calendar can still fail (Feb 30, month 13, year 0): messages without it.
    moment = datetime.fromisoformat(f"{match['date']}T{match['time']}{offset}")
    utc_ms(moment)
    return moment


def parse_iso(text: str) -> int:
    """Epoch ms of an RFC 3339 time (`parse_time`)."""
    return utc_ms(parse_time(text))
