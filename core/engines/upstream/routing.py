"""Which base URL gets an attempt, and what the store should learn about upstreams.

Per process (SPEC'd so: every process spreads its own attempts): the URL with the
fewest of this process's attempts in flight, skipping URLs in cool-down after a refused
connection or a timeout. What happened (errors by code, cool-downs) is also kept as
reports that the sweeper writes to the store, so `/metrics` on any API process shows it.

A URL whose cool-down has ended is tried again by one attempt alone, its probe: until
the server answers it (or the probe ends), the URL is skipped as if still cooling. The
attempts claimed together at the cool-down's end would otherwise all go at once to a
server that is still down, each spending an attempt. An attempt that finds every URL
cooling sends nothing (`NoUrlNow`). So that the worker does not claim work it cannot
start, only to hand it back, its claim takes no task of a model while that holds, and
one task alone (the probe's) while its only usable URLs await their probe
(`claim_caps`). The probe is the URL's, not the model's: models sharing a base URL get
one probe task among them, not one each, offered to one model per claim in turn; a model
whose claim took none of its tasks passes the turn on at once (`claim_took`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from core.clock import Clock
from core.engines.base import NotStarted
from core.engines.upstream.protocol import UNAVAILABLE

# How long a claim told it may take a model's probe task (`claim_caps`) holds that
# probe for the attempt it claimed, until that attempt's `pick`: longer than an attempt
# takes from its claim to its first pick on a busy machine. Also how long the offers
# pause once each model resting on the URL was offered it in turn and none had a task
# due (`claim_took`): what a task coming due later waits at most for its turn, however
# many models share the URL, and all the claims those rounds cost while nothing is due.
_PROBE_PROMISE_MS = 2_000


@dataclass(frozen=True)
class _Promise:
    """A URL's probe, promised to a claim of `model`'s tasks until `until_ms`
    (`claim_caps`)."""

    model: str
    until_ms: int


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
        # URL awaiting its probe → the model whose claim was last told it may take a
        # task for it; removed by that task's `pick` (`claim_caps`).
        self._promises: dict[str, _Promise] = {}
        # The promises the last `claim_caps` made, until `claim_took` hears what its
        # claim took.
        self._offers: dict[str, _Promise] = {}
        # URL awaiting its probe → the models offered it since its offers last paused
        # whose claims took none of their tasks (`claim_took`).
        self._declined: dict[str, set[str]] = {}
        # When a cap of 0 the last `claim_caps` gave may lift (None: it gave none).
        self._caps_lift_at: int | None = None
        self._reports = Reports()

    def pick(self, model_id: str, urls: Sequence[str], tried: set[str]) -> str | None:
        """The untried usable URL with the fewest attempts in flight (the entry's order
        breaks ties), or None when there is none. A URL whose cool-down has ended is
        picked as its probe: no other attempt gets it until `answered`, `failed` or the
        end of this one's `using`."""
        now = self._clock.now_ms()
        with self._lock:
            self._urls_of[model_id] = tuple(urls)
            for u in urls:
                promise = self._promises.get(u)
                if promise is not None and promise.model == model_id:
                    del self._promises[u]
            usable = [u for u in urls if u not in tried and self._usable(u, now)]
            url = min(usable, key=lambda u: self._in_flight[u], default=None)
            if url is not None and self._cool_until.pop(url, None) is not None:
                self._probing.add(url)
                self._declined.pop(url, None)
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

    def claim_caps(self) -> dict[str, int]:
        """At most how many tasks of each model (as `pick` last saw its URLs) a claim
        of this process should take now: 0 while every URL cools down or is being
        probed (an attempt would send nothing), 1 while the only usable ones await
        their probe (that task's attempt is the probe; the others would find no URL and
        be handed back). A model not named has no cap: a URL of it is plainly usable.

        A 1 is a promise to the one claim asking, recorded on the URLs awaiting their
        probe that it is for: until the task it takes picks its URL (or
        `_PROBE_PROMISE_MS` pass, the claim having taken none), the next claims get 0
        for that model, since the worker claims again as soon as a claim has started
        work. The promise is the URL's, not the model's: models sharing a URL would
        otherwise each get a task claimed for its one probe, all but the first handed
        back. So the others get 0 for it meanwhile, and a lapsed promise passes to the
        next model sharing the URL: a model with no task due does not keep the others'
        probe waiting. `claim_took` lapses it as soon as its claim is known to have
        taken none of the model's tasks."""
        now = self._clock.now_ms()
        with self._lock:
            caps = {}
            self._offers = {}
            for model, urls in self._urls_of.items():
                if any(self._plainly_usable(u) for u in urls):
                    continue
                due = [u for u in urls if self._usable(u, now)]
                if any(self._promised(u, now, model) for u in due):
                    caps[model] = 0
                    continue
                offered = [u for u in due
                           if not self._promised(u, now) and self._turn_of(u) == model]
                for u in offered:
                    self._promises[u] = self._offers[u] = _Promise(
                        model, now + _PROBE_PROMISE_MS)
                caps[model] = 1 if offered else 0
            self._caps_lift_at = min(
                (t for model, cap in caps.items() if cap == 0
                 for t in self._ends(self._urls_of[model], now)), default=None)
            return caps

    def _ends(self, urls: Sequence[str], now: int) -> Iterator[int]:
        """When each of `urls` still cooling down or promised leaves that state: what may
        lift a cap of 0 on their model (the lock held). A probe out has no end known
        beforehand: its attempt's end frees a slot, which wakes the claimer anyway."""
        for url in urls:
            if self._cool_until.get(url, 0) > now:
                yield self._cool_until[url]
            promise = self._promises.get(url)
            if promise is not None and self._promised(url, now):
                yield promise.until_ms

    def claim_took(self, models: Collection[str]) -> None:
        """The claim the last `claim_caps` was for took tasks of `models`. A model it
        offered a probe but took none of had none due (or no room): its promise lapses
        now and the claimer claims again at once (`caps_lift_in_seconds`) for the next
        model's turn, instead of `_PROBE_PROMISE_MS` later for each model in turn (the
        tenth model sharing a URL waited 18 s). Once every model resting on the URL was
        offered it and none took it, the last promise stands its time: a pause before
        the next round, so that with nothing due the rounds cost N claims every
        `_PROBE_PROMISE_MS`, not N claims at each wake-up (a poll every 50 ms without
        push)."""
        now = self._clock.now_ms()
        with self._lock:
            offers, self._offers = self._offers, {}
            for url, promise in offers.items():
                if promise.model in models or self._promises.get(url) is not promise:
                    continue  # its task will pick the URL, or already did
                declined = self._declined.setdefault(url, set())
                declined.add(promise.model)
                if declined.issuperset(self._resting_on(url)):
                    del self._declined[url]  # a round found none due: pause
                else:
                    self._promises[url] = _Promise(promise.model, now)
                    self._caps_lift_at = now

    def caps_lift_in_seconds(self) -> float | None:
        """How long until a cap of 0 the last `claim_caps` gave may lift: the first end
        of a cool-down or probe promise that held a model at 0 (0 when it has passed,
        or when `claim_took` passed a probe on); None when that claim held no model at
        0. Its claimer claims again then: a task held back by a cool-down would
        otherwise wait for the next poll past its end."""
        now = self._clock.now_ms()
        with self._lock:
            if self._caps_lift_at is None:
                return None
            return max(0, self._caps_lift_at - now) / 1000

    def _promised(self, url: str, now: int, model: str | None = None) -> bool:
        """Whether `url`'s probe is promised to a claim (of `model`'s tasks, if given)
        and the promise has not lapsed (the lock held)."""
        promise = self._promises.get(url)
        return (promise is not None and now < promise.until_ms
                and model in (None, promise.model))

    def _turn_of(self, url: str) -> str | None:
        """The model whose claim may take `url`'s probe task next: the one after the
        model of its lapsed promise among those resting on it, in the order `pick` first
        saw them (the lock held)."""
        resting = self._resting_on(url)
        promise = self._promises.get(url)
        if not resting:
            return None
        if promise is None or promise.model not in resting:
            return resting[0]
        return resting[(resting.index(promise.model) + 1) % len(resting)]

    def _resting_on(self, url: str) -> list[str]:
        """The models with `url` and no plainly usable URL, in the order `pick` first
        saw them: those among which its probe goes round (the lock held)."""
        return [m for m, us in self._urls_of.items()
                if url in us and not any(self._plainly_usable(u) for u in us)]

    def _plainly_usable(self, url: str) -> bool:
        """Usable without a probe: never cooled down, or its probe answered or ended
        (the lock held)."""
        return url not in self._cool_until and url not in self._probing

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
                self._declined.pop(url, None)
            self._probing.discard(url)

    def take_reports(self) -> Reports:
        with self._lock:
            taken, self._reports = self._reports, Reports()
            return taken


ROUTER = Router()
"""The process's router: in-flight counts are per process by definition."""
