"""Which base URL gets an attempt, and what the store should learn about upstreams.

Per process (SPEC'd so: every process spreads its own attempts): the URL with the
fewest of this process's attempts in flight, skipping URLs in cool-down after a refused
connection or a timeout. What happened (errors by code, cool-downs) is also kept as
reports that the sweeper writes to the store, so `/metrics` on any API process shows it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from core.clock import Clock


@dataclass
class Reports:
    """Upstream events not yet written to the store."""

    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (model, code)
    cooldowns: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, url) → ms

    def __bool__(self) -> bool:
        return bool(self.errors or self.cooldowns)


class Router:
    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or Clock()
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self._cool_until: dict[str, int] = {}
        self._reports = Reports()

    def pick(self, urls: Sequence[str], tried: set[str]) -> str | None:
        """The untried URL not in cool-down with the fewest attempts in flight (the
        entry's order breaks ties), or None when there is none."""
        now = self._clock.now_ms()
        with self._lock:
            usable = [u for u in urls if u not in tried and self._cool_until.get(u, 0) <= now]
            return min(usable, key=lambda u: self._in_flight[u], default=None)

    def cooldown_left_seconds(self, urls: Sequence[str]) -> float:
        """How long until the first of `urls` leaves its cool-down (0: one is usable)."""
        now = self._clock.now_ms()
        with self._lock:
            return max(0, min(self._cool_until.get(u, 0) - now for u in urls)) / 1000

    @contextmanager
    def using(self, url: str) -> Iterator[None]:
        with self._lock:
            self._in_flight[url] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[url] -= 1

    def failed(self, model_id: str, url: str, code: str, *, cooldown_seconds: float) -> None:
        """Count an error; with `cooldown_seconds` > 0, skip the URL that long."""
        with self._lock:
            self._reports.errors[(model_id, code)] += 1
            if cooldown_seconds > 0:
                until = self._clock.now_ms() + int(cooldown_seconds * 1000)
                self._cool_until[url] = until
                self._reports.cooldowns[(model_id, url)] = until

    def take_reports(self) -> Reports:
        with self._lock:
            taken, self._reports = self._reports, Reports()
            return taken


ROUTER = Router()
"""The process's router: in-flight counts are per process by definition."""
