"""How long a task waits before its next attempt after a retryable failure.

Exponential in the attempt number so a failing dependency is not hammered, capped so a
task is never parked for hours, and jittered so tasks that failed together (a model
that would not load, a database blip) do not all come back in the same instant.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def retry_delay_ms(
    attempt: int,
    *,
    base_seconds: float,
    max_seconds: float,
    uniform: Callable[[], float] = random.random,
) -> int:
    """The delay after failed attempt `attempt` (1-based), in milliseconds.

    "Equal jitter": half of the capped exponential step is kept, the other half is
    random, so the delay never collapses to zero and never exceeds `max_seconds`.
    `uniform` returns a float in [0, 1); tests pass a fixed one.
    """
    exponent = max(0, attempt - 1)
    step = max_seconds if exponent >= 64 else min(max_seconds, base_seconds * 2**exponent)
    return int(1000 * (step / 2 + uniform() * step / 2))
