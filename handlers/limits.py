"""This API process's share of the per-client limits (`core.quotas`): the request rate
and the streams open at once. `max_active_tasks` is not here: the store checks it in
the enqueue transaction, across every process.

Both are kept in this process's memory, so N API processes admit up to N times a
client's rate and streams (docs/operations.md says so): a shared counter would cost a
store round trip on every request.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from core.clients import Client
from core.errors import TooManyRequests
from core.settings import Settings

_MAX_CLIENTS = 10_000  # buckets kept; beyond it the idlest are dropped (a full bucket)
# The longest `Retry-After` a slow bucket names: a rate as small as the API admits
# (5e-324 per second) would otherwise name an infinite wait, or one of 300 digits.
_LONGEST_RETRY_SECONDS = 86_400.0


@dataclass
class _Bucket:
    tokens: float
    at: float


class ClientLimits:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._streams: dict[str, int] = {}

    def admit_request(self, client: Client) -> None:
        """Take one token from the client's bucket, or `rate_limited`. The bucket holds
        one second's worth (at least one request) and refills continuously."""
        rate = client.limits.effective(self._settings).requests_per_second or 0
        if rate <= 0:
            return
        now = self._clock()
        capacity = max(1.0, rate)
        bucket = self._buckets.get(client.id)
        if bucket is None:
            if len(self._buckets) >= _MAX_CLIENTS:
                self._buckets.clear()
            bucket = self._buckets[client.id] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return
        raise TooManyRequests("rate_limited", f"this client may send {limit_header(rate)} "
                              "requests per second; slow down", limit=rate,
                              retry_after=min((1 - bucket.tokens) / rate,
                                              _LONGEST_RETRY_SECONDS))

    def hold_stream(self, client: Client, *, refuse: bool = True) -> Callable[[], None]:
        """Count one more stream or wait of the client, or `too_many_streams` (unless
        `refuse` is off: a replay is counted, never refused); returns the function that
        ends it (calling it twice ends it once)."""
        limit = client.limits.effective(self._settings).max_streams or 0
        open_now = self._streams.get(client.id, 0)
        if refuse and open_now >= limit:
            raise TooManyRequests("too_many_streams", f"this client may hold {limit} streams "
                                  "and waits at once; close one first", limit=limit,
                                  retry_after=1.0)
        self._streams[client.id] = open_now + 1
        ended = False

        def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            left = self._streams.get(client.id, 1) - 1
            if left > 0:
                self._streams[client.id] = left
            else:
                self._streams.pop(client.id, None)
        return end


def end_with(owner: object, end: Callable[[], None]) -> None:
    """Make sure `end` runs once `owner` (a stream's iterator) is gone, even if it was
    never started: a generator's `finally` only runs once it has begun."""
    weakref.finalize(owner, end)


def reset_header(seconds: float) -> str:
    """OpenAI's `x-ratelimit-reset-requests` form, a Go duration: milliseconds under a
    second (`20ms`), else the wait rounded up to whole seconds, then split: `1s`, `6m0s`,
    `1h2m3s`. Splitting first and rounding each part let the seconds reach 60 (`1m60s`)."""
    millis = max(1, math.ceil(seconds * 1000))
    if millis < 1000:
        return f"{millis}ms"
    hours, left = divmod(math.ceil(seconds), 3600)
    minutes, whole_seconds = divmod(left, 60)
    if hours:
        return f"{hours}h{minutes}m{whole_seconds}s"
    if minutes:
        return f"{minutes}m{whole_seconds}s"
    return f"{whole_seconds}s"


def limit_header(limit: float) -> str:
    """A limit as `x-ratelimit-limit-requests` writes it: a whole number as an integer
    (`1234567`, where `:g` wrote `1.23457e+06`), any other in full and without an
    exponent (`0.1234567`, `0.00001`)."""
    if float(limit).is_integer():
        return str(int(limit))
    return format(Decimal(str(float(limit))), "f")
