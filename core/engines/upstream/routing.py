"""Which base URL gets an attempt, and what the store should learn about upstreams.

Per process (SPEC'd so: every process spreads its own attempts): the URL with the
fewest of this process's attempts in flight, skipping URLs in cool-down after a refused
connection or a timeout. What happened (errors by code, cool-downs) is also kept as
reports that the sweeper writes to the store, so `/metrics` on any API process shows it.

A URL whose cool-down has ended is tried again by one attempt alone, its probe: until
the server answers it (or the probe ends), the URL is skipped as if still cooling. The
attempts claimed together at the cool-down's end would otherwise all go at once to a
server that is still down, each spending an attempt. An attempt that finds every URL
cooling sends nothing (`NoUrlNow`); the claim leaves a model alone while that holds
(`resting`), so the worker does not claim work it cannot start.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from core.clock import Clock
from core.engines.base import NotStarted
from core.engines.upstream.protocol import UNAVAILABLE


@dataclass
class Reports:
    """Upstream events not yet written to the store."""

    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (model, code)
    cooldowns: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, url) → ms

    def __bool__(self) -> bool:
        return bool(self.errors or self.cooldowns)


class NoUrlNow(NotStarted):
    """Every base URL of the entry is cooling down, or being probed, in this process:
    the attempt sent no request."""

    def __init__(self, urls: Sequence[str], wait_seconds: float) -> None:
        named = urls[0] if len(urls) == 1 else f"{urls[0]} and {len(urls) - 1} more"
        super().__init__(UNAVAILABLE, f"upstream {named}: in cool-down after "
                         "failures; no request sent", retry_after_seconds=wait_seconds)


class Router:
    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or Clock()
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        # URL → end of its cool-down; removed when its probe starts.
        self._cool_until: dict[str, int] = {}
        self._probing: set[str] = set()  # URLs whose probe has not been answered yet
        self._urls_of: dict[str, tuple[str, ...]] = {}  # model id → its base URLs, as picked
        self._reports = Reports()

    def pick(self, model_id: str, urls: Sequence[str], tried: set[str]) -> str | None:
        """The untried usable URL with the fewest attempts in flight (the entry's order
        breaks ties), or None when there is none. A URL whose cool-down has ended is
        picked as its probe: no other attempt gets it until `answered`, `failed` or the
        end of this one's `using`."""
        now = self._clock.now_ms()
        with self._lock:
            self._urls_of[model_id] = tuple(urls)
            usable = [u for u in urls if u not in tried and self._usable(u, now)]
            url = min(usable, key=lambda u: self._in_flight[u], default=None)
            if url is not None and self._cool_until.pop(url, None) is not None:
                self._probing.add(url)
            return url

    def _usable(self, url: str, now: int) -> bool:
        """Neither cooling down nor being probed (the lock held)."""
        return self._cool_until.get(url, 0) <= now and url not in self._probing

    def cooldown_left_seconds(self, urls: Sequence[str]) -> float:
        """How long until the first of `urls` leaves its cool-down (0: one is usable or
        being probed)."""
        now = self._clock.now_ms()
        with self._lock:
            return max(0, min(self._cool_until.get(u, 0) - now for u in urls)) / 1000

    def resting(self) -> set[str]:
        """The models (as `pick` last saw their URLs) none of whose URLs an attempt of
        this process could use now: a claim here leaves their tasks to others."""
        now = self._clock.now_ms()
        with self._lock:
            return {model for model, urls in self._urls_of.items()
                    if not any(self._usable(u, now) for u in urls)}

    def answered(self, url: str) -> None:
        """The server at `url` answered a request: a probe of it has succeeded."""
        with self._lock:
            self._probing.discard(url)

    @contextmanager
    def using(self, url: str) -> Iterator[None]:
        with self._lock:
            self._in_flight[url] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[url] -= 1
                self._probing.discard(url)

    def failed(self, model_id: str, url: str, code: str, *, cooldown_seconds: float) -> None:
        """Count an error; with `cooldown_seconds` > 0, skip the URL that long."""
        with self._lock:
            self._reports.errors[(model_id, code)] += 1
            if cooldown_seconds > 0:
                until = self._clock.now_ms() + int(cooldown_seconds * 1000)
                self._cool_until[url] = until
                self._reports.cooldowns[(model_id, url)] = until
            self._probing.discard(url)

    def take_reports(self) -> Reports:
        with self._lock:
            taken, self._reports = self._reports, Reports()
            return taken


ROUTER = Router()
"""The process's router: in-flight counts are per process by definition."""
