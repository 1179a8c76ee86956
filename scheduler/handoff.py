"""When an attempt needs a runner apart from its engine: only once the engine runs long.

A runner (in a worker, the stream thread: `scheduler.stream_thread`) watches an
attempt while its engine runs (`scheduler.execute`): it flushes
text on time, acts on flags, enforces the execution timeout and writes the outcome
even when the engine hangs. An engine that returns within a few milliseconds needs
none of that while it runs: little is due that early (the first text's flush, which
then waits at most until the hand-off, the start's write a flush interval after the
load, the timeout after seconds), and the engine itself polls the flags. So a local
attempt starts on an engine thread that runs the engine and then, once it returned,
the attempt's stream as the runner would have (`scheduler.execute.execute_here`): no
hand-over of the engine to a thread of its own, no runner woken for the engine's
items. Those two thread hops cost more CPU than the rest of a no-op task's Python
work (issue 15). One watcher thread per worker process hands every attempt whose
engine is still running `after_seconds` after it started to a runner, which streams
it exactly as before while the engine goes on on its thread; the engine thread's own
stream and the runner's are exclusive (`watch` / the check it returns, under one lock).
The same watch serves a claim's attempts run in turn on one engine thread
(`scheduler.workers`): those not started `after_seconds` after their batch did are
moved to engine threads of their own, so none waits longer behind another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from core.thread_names import named_thread

log = logging.getLogger(__name__)


class Handoffs:
    def __init__(self, *, after_seconds: float) -> None:
        self._after = after_seconds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # Watched attempts, oldest first (insertion order): when each is due, and how it
        # is handed over.
        self._pending: dict[object, tuple[float, Callable[[], object]]] = {}
        self._asleep = False  # the watcher waits for a watch to come, not for a time
        self._stopping = False
        self._thread = named_thread(self._run, "handoff")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watcher; attempts still watched are left to their engine threads."""
        with self._lock:
            self._stopping = True
            self._changed.notify()
        self._thread.join()

    def watch(self, hand_over: Callable[[], object]) -> Callable[[], bool]:
        """Watch an engine that starts now: `hand_over()` is called (on the watcher) if
        it still runs `after_seconds` from now. Returns the check its thread makes once
        the engine returned: True when the attempt was not handed over (that thread now
        streams it), False when a runner does."""
        key = object()
        with self._lock:
            if self._asleep:  # else it wakes by itself within `after_seconds`
                self._asleep = False
                self._changed.notify()
            self._pending[key] = (time.monotonic() + self._after, hand_over)

        def kept() -> bool:
            with self._lock:
                return self._pending.pop(key, None) is not None

        return kept

    def _run(self) -> None:
        """Hand over whatever is due; with nothing watched, look again `after_seconds`
        later, and only once nothing came meanwhile sleep until a watch wakes it: in a
        drain, where a batch's short engines come and go every few milliseconds, the
        watcher then wakes once per `after_seconds`, not once per batch."""
        with self._lock:
            while not self._stopping:
                if not self._pending:
                    self._changed.wait(self._after)
                    self._asleep = not self._pending
                    while self._asleep and not self._stopping:
                        self._changed.wait()
                    continue
                due_at = next(iter(self._pending.values()))[0]
                left = due_at - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                now, handed = time.monotonic(), []
                for key, (at, hand_over) in list(self._pending.items()):
                    if at > now:
                        break
                    del self._pending[key]
                    handed.append(hand_over)
                self._lock.release()
                try:
                    for each in handed:
                        try:
                            each()
                        except Exception:  # that attempt's lease will expire; the watcher goes on
                            log.exception("an attempt could not be handed to a runner")
                finally:
                    self._lock.acquire()
