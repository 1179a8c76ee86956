"""The one clock a test sets by hand: time moves only when the test moves it."""

from __future__ import annotations

from core.clock import Clock


class HandClock(Clock):
    """`now_ms` is `ms`, which the test sets or advances (`clock.ms += 5_000`)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def now_ms(self) -> int:
        return self.ms
