"""Task priorities: 0..9, lower runs first, and OpenAI's `service_tier` names for them.

OpenAI clients say how urgent a request is with `service_tier`; taskward accepts those
names as aliases, so an SDK user need not learn a second knob (docs/operations.md).
"""

from __future__ import annotations

HIGHEST_PRIORITY = 0
LOWEST_PRIORITY = 9
DEFAULT_PRIORITY = 5
SERVICE_TIERS: dict[str, int] = {"priority": 1, "default": DEFAULT_PRIORITY,
                                 "auto": DEFAULT_PRIORITY, "flex": 8}
