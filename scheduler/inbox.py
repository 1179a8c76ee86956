"""The hand-off from an attempt's engine thread (and the threads raising its flags) to
its runner, which can hold chunks without being woken for each.

While the runner already has text waiting for a timed flush, a chunk arriving changes
nothing it would act on before that flush is due, unless it brings the pending text to
the flush size: the arrival time that matters is the oldest pending text's, and the
flush takes the latest snapshot either way. So while text is pending, chunks gather
here without waking the runner, which takes them all when it wakes for the flush (or
for anything else). With a steady stream that is about two runner wake-ups per flush
(the first text after the last flush, then the flush) instead of one per network read.
Every other item (loaded, ended, raised, a flag's wake-up) wakes the runner at once, as
does any chunk while nothing is pending.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from core.engines.base import Chunk


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._waiting = False  # the runner is in `take`'s wait, and no wake-up is owed yet
        # While waiting: None when every item ends the wait, else how many more bytes
        # of chunk text it may sleep through.
        self._room: int | None = None
        # At most one wake-up is put per wait; one left over from a wait that timed
        # out at the same moment only makes the next wait return early, empty-handed.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # Set when one thread follows many attempts (`scheduler.stream_thread`): a
        # wake-up calls it instead (under this inbox's lock), and that thread `arm`s the
        # inbox and `take_now`s its items rather than waiting in `take`.
        self.notify: Callable[[], None] | None = None

    def put(self, item: Any) -> None:
        """Hand over `item`, waking the runner."""
        with self._lock:
            self._items.append(item)
            self._wake_runner()

    def put_chunk(self, chunk: Chunk) -> None:
        """Hand over `chunk`, waking the runner unless it is holding chunks and this one
        leaves the pending text below the flush size."""
        with self._lock:
            self._items.append(chunk)
            if not self._waiting:
                return
            if self._room is not None:
                self._room -= len(chunk.text.encode())
                if self._room > 0:
                    return
            self._wake_runner()

    def take(self, timeout_s: float, *, room_bytes: int | None) -> list[Any]:
        """Everything handed over so far, waiting up to `timeout_s` when there is none.

        `room_bytes` None: any item ends the wait. Otherwise chunks end it only once
        their text adds up to `room_bytes` bytes (what the pending text lacks of the
        flush size); other items always do."""
        with self._lock:
            wait = not self._items
            if wait:
                self._waiting, self._room = True, room_bytes
        if wait:
            try:
                self._wake.get(timeout=timeout_s)
            except queue.Empty:
                pass
        with self._lock:
            self._waiting = False
            items, self._items = self._items, []
        return items

    def arm(self, room_bytes: int | None) -> bool:
        """`take`'s wait without the waiting: from now, what would end it calls `notify`
        once. False when items already wait (nothing armed: take them now)."""
        with self._lock:
            if self._items:
                return False
            self._waiting, self._room = True, room_bytes
            return True

    def take_now(self) -> list[Any]:
        """Everything handed over so far, without waiting; disarms."""
        with self._lock:
            self._waiting = False
            items, self._items = self._items, []
        return items

    def _wake_runner(self) -> None:
        if self._waiting:
            self._waiting = False
            if self.notify is not None:
                self.notify()
            else:
                self._wake.put(None)
