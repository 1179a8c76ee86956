"""The throughput chart of the overview, laid out here and drawn as inline SVG.

Geometry is computed on the server so the page needs no charting script: one stacked
bar per minute (completed below, failed on top), scaled to the busiest minute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.clock import iso
from core.store.finished_per_minute import MinuteCounts

WIDTH = 720
HEIGHT = 160
GAP = 2


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float
    label: str  # what a hover shows: the minute and its two counts


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    peak: int  # the busiest minute's total, the top of the scale
    completed: int  # over the whole window
    failed: int
    minutes: int


def throughput_chart(minutes: Sequence[MinuteCounts]) -> Chart:
    peak = max((m.completed + m.failed for m in minutes), default=0)
    scale = HEIGHT / peak if peak else 0.0
    slot = WIDTH / max(len(minutes), 1)
    bars = []
    for index, minute in enumerate(minutes):
        completed_h = minute.completed * scale
        failed_h = minute.failed * scale
        stamp = (iso(minute.start_ms) or "")[11:16]
        bars.append(Bar(
            x=round(index * slot + GAP / 2, 2), width=round(slot - GAP, 2),
            completed_y=round(HEIGHT - completed_h, 2), completed_height=round(completed_h, 2),
            failed_y=round(HEIGHT - completed_h - failed_h, 2),
            failed_height=round(failed_h, 2),
            label=f"{stamp} UTC: {minute.completed} completed, {minute.failed} failed"))
    return Chart(WIDTH, HEIGHT, bars, peak, sum(m.completed for m in minutes),
                 sum(m.failed for m in minutes), len(minutes))
