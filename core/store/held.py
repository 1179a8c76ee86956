"""The tasks whose leases this process's workers hold, for an API in the same process.

Every event of such a task is logged by this process and announced to it after the
commit, but a cancel's from elsewhere, which the holding worker hears within its lease
keeper's tick. An API in the same process (`taskward run`) therefore polls their logs
only as a safety net (`handlers.live`), and must hear when one is let go: another
process may claim it next, and then only a poll tells.
"""

from __future__ import annotations

from collections.abc import Callable


class HeldTasks:
    """Task ids held here, and who hears a release. `hold`, `release` and `in` need no
    lock of ours: each set operation is atomic under the interpreter's lock, and the
    listeners change only at an API's start and stop."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._listeners: list[Callable[[str], None]] = []

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids

    def hold(self, task_id: str) -> None:
        self._ids.add(task_id)

    def release(self, task_id: str) -> None:
        """Let `task_id` go, and tell the listeners (on the releasing thread)."""
        self._ids.discard(task_id)
        for listener in self._listeners:
            listener(task_id)

    def on_release(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(task_id)` at every release until the returned function is called."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)
