"""Per-client limits: how much of the service one client may hold at once.

Three limits, each stored on the client (NULL: the setting's default applies):
- `max_active_tasks`: tasks queued or running at once. Exact across API processes and
  machines: checked in the transaction that inserts the tasks, under the client's row
  lock (`core.store.active_quota`). 0 = unlimited.
- `requests_per_second`: a token bucket in each API process (N processes admit up to N
  times the rate). 0 = unlimited.
- `max_streams`: SSE streams and waits (`?wait=`, `background: false`) open at once in
  one API process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from core.settings import Settings


@dataclass(frozen=True)
class Limits:
    """A client's own limits; None where the setting's default applies."""

    max_active_tasks: int | None = None
    requests_per_second: float | None = None
    max_streams: int | None = None

    def __post_init__(self) -> None:
        # Here, not in each layer that reads a rate (API body, CLI option): every
        # limit stored or compared was built as `Limits`, so none keeps a `-0.0`.
        if self.requests_per_second is not None:
            object.__setattr__(self, "requests_per_second", _plain_rate(self.requests_per_second))

    def columns(self) -> dict[str, Any]:
        """The client row's columns for these limits."""
        return asdict(self)

    def effective(self, settings: Settings) -> Limits:
        """Every limit filled in: the client's own, else the setting's default."""
        return Limits(
            max_active_tasks=_or(self.max_active_tasks, settings.client_max_active_tasks),
            requests_per_second=_or(self.requests_per_second,
                                    settings.client_requests_per_second),
            max_streams=_or(self.max_streams, settings.client_max_streams),
        )


def _or(own: Any, default: Any) -> Any:
    return default if own is None else own


def _plain_rate(rate: float) -> float:
    """`rate` as it is stored and shown: `-0.0`, which every bound admits as 0, becomes
    0.0 (it was stored and listed as `-0.0`)."""
    return rate + 0.0


LIMIT_NAMES = tuple(Limits.__dataclass_fields__)
# The limits where 0 means unlimited (`max_streams` is at least 1).
_ZERO_IS_UNLIMITED = frozenset({"max_active_tasks", "requests_per_second"})


def limit_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` (name -> value, None: back to the setting's default) as the client's
    columns take them: only the names given, each value as `Limits` holds it. A name
    that is no limit is a `ValueError`, the caller's mistake."""
    unknown = set(changes) - set(LIMIT_NAMES)
    if unknown:
        raise ValueError(f"not a limit: {sorted(unknown)[0]}")
    columns = Limits(**changes).columns()
    return {name: columns[name] for name in changes}


def first_looser(
    granted: Mapping[str, Any], own: Limits, settings: Settings
) -> str | None:
    """The name of the first limit in `granted` (name -> value, None: the setting's
    default) that would allow more than `own` does, both with the defaults filled in;
    None when none would. Only the names in `granted` are compared: a change of limits
    is judged on the limits it sets, a pairing code on all of them."""
    wanted = Limits(**granted).effective(settings)
    bound = own.effective(settings)
    return next((name for name in LIMIT_NAMES if name in granted
                 and _looser(name, getattr(wanted, name), getattr(bound, name))), None)


def _looser(name: str, value: float, bound: float) -> bool:
    """Whether `value` allows more than `bound` for limit `name`: unlimited (0, where
    0 means that) is looser than any number, and a bigger number is looser."""
    if name in _ZERO_IS_UNLIMITED and (bound == 0 or value == 0):
        return bound != 0
    return value > bound
