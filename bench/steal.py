"""The share of the machine's CPU time the hypervisor gave to other guests.

On a shared VM a neighbour can take a third of both cores for tens of seconds (seen:
`vmstat`'s `st` at 33 % while a 5-second enqueue ran at 40 % of its rate before and
after). A figure measured through such a burst says nothing about the code; printing
the steal beside it lets a reader set that round aside instead of blaming the code.
"""

from __future__ import annotations

from pathlib import Path


def _cpu_ticks() -> tuple[int, int]:
    """(steal, all) ticks of every CPU since boot, from /proc/stat's `cpu` line
    (guest time is already inside user and nice, so it is not added again)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


class Steal:
    """A stopwatch of the hypervisor's steal, started when it is made."""

    def __init__(self) -> None:
        self._steal, self._all = _cpu_ticks()

    def percent(self) -> float:
        """Per cent of all CPU time since this was made that the hypervisor stole."""
        steal, every = _cpu_ticks()
        return 100 * (steal - self._steal) / max(1, every - self._all)


def percents(shares: list[float]) -> str:
    """Rounds' steal shares as printed beside their figures: `0 %, 13 %, 2 %`."""
    return ", ".join(f"{share:.0f} %" for share in shares)
