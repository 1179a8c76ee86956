"""How often a thread of this process has slept, as Linux counts it: the tests that show
a thread sleeping instead of ticking compare two readings."""

from __future__ import annotations

from pathlib import Path


def voluntary_switches(native_id: int) -> int:
    """The thread's voluntary context switches so far (`threading.Thread.native_id`)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])
