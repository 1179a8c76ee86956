"""The one source of time: UTC epoch milliseconds.

Every stored time comes from here, never from the database's `now()`, so that tests
can freeze and move time with freezegun (which patches `time.time`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import overload


class Clock:
    def now_ms(self) -> int:
        return int(time.time() * 1000)


@overload
def iso(ms: int) -> str: ...
@overload
def iso(ms: None) -> None: ...
@overload
def iso(ms: int | None) -> str | None: ...
def iso(ms: int | None) -> str | None:
    """RFC 3339 UTC with milliseconds, or None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def parse_iso(text: str) -> int:
    """Epoch ms of an RFC 3339 timestamp; a timestamp without offset is refused."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("timestamp needs a UTC offset")
    return int(moment.timestamp() * 1000)


def epoch_ms(moment: datetime) -> int:
    """Epoch ms of an aware datetime, exactly (no float rounding), floored."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
