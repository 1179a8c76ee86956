"""The threads engines run on, reused from one attempt to the next.

An attempt's engine runs on a thread apart from its runner, so the runner never blocks
on it (`scheduler.execute`); a local attempt starts on one of these threads and has a
runner only if its engine runs long (`scheduler.handoff`). A thread started and ended
per attempt cost ~50 us of CPU
(clone, the stack's mmap and munmap, the start handshake), a tenth of a no-op task's
whole cost in a draining sweeper (issue 15); so a thread whose engine returned waits
for the next attempt's engine instead of ending. No attempt ever waits for a thread: a
hung engine keeps its own, and when none is idle a new one starts. At most
`idle_limit` threads wait idle (more end: a burst of upstream attempts leaves no crowd
behind), and `stop` ends the idle ones and joins the rest for a bounded time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from core.thread_names import named_thread

_IDLE_NAME = "engine-idle"


class EngineRun:
    """One engine's run on one of the threads (`alive` until its function returned).

    A plain flag, no `threading.Event`: only `stop` ever waits for it, and making a lock
    and a condition per attempt costs more than a no-op engine's whole run."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target = target
        self.name = name
        self.alive = True

    def run(self) -> None:
        try:
            self._target()
        finally:
            self.alive = False


class EngineThreads:
    def __init__(self, *, idle_limit: int) -> None:
        self._idle_limit = idle_limit
        self._runs: queue.SimpleQueue[EngineRun | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads that are, or are about to be, waiting for a run
        self._running: dict[threading.Thread, EngineRun | None] = {}
        self._stopping = False

    def start(self, target: Callable[[], None], name: str) -> EngineRun:
        """Run `target` on an idle thread, or on a new one when none is idle."""
        run = EngineRun(target, name)
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1
            else:
                # One kernel name for all: the thread serves one attempt after another.
                thread = named_thread(self._serve, name, kernel_name="engine")
                self._running[thread] = None
        if not reuse:
            thread.start()
        # Every run put here meets a `get`: one per new thread, one per idle count taken.
        self._runs.put(run)
        return run

    def _serve(self) -> None:
        me = threading.current_thread()
        while (run := self._runs.get()) is not None:
            me.name = run.name  # what a warning about a hung engine names
            with self._lock:
                self._running[me] = run
            run.run()
            me.name = _IDLE_NAME
            with self._lock:
                self._running[me] = None
                if self._stopping or self._idle >= self._idle_limit:
                    break
                self._idle += 1
        with self._lock:
            del self._running[me]

    def stop(self, timeout: float) -> list[str]:
        """End the idle threads and wait up to `timeout` for the others to finish their
        engine; the names of those still running one (left to process exit)."""
        with self._lock:
            self._stopping = True
            idle, self._idle = self._idle, 0
            threads = list(self._running)
        for _ in range(idle):
            self._runs.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return [run.name for run in self._running.values() if run is not None]
