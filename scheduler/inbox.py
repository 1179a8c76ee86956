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

What chunks wait here is bounded (`HELD_BOUND`), for a producer that can hold back
without blocking a thread: the upstream engine's network loop asks `room` after each
read, and while the inbox holds more than the bound it reads no more (it wakes the
runner) until the runner's next take. So an upstream that sends faster than the runner
stores is slowed by TCP instead of buffered here without end (an unbounded inbox took
gigabytes a minute; core/engines/upstream/engine.py). A healthy stream never meets the
bound: the runner takes what waits once its text reaches the flush size (512 bytes by
default) or a flush falls due. A runner that fell behind takes at most the bound in one
pass, so one firehose cannot keep the thread that follows every stream to itself. The
local engine does not ask: its decode loop makes tens of tokens a second, shared
between its sequences, and the runner takes them at every flush.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from core.engines.base import Chunk

# How much the chunks waiting in one inbox may hold before its producer is held back:
# their text's characters plus `CHUNK_COST` each. The memory they take stays about this,
# plus the chunk of one network read (at most 64 KiB) that comes before the question.
HELD_BOUND = 1 << 16
# A chunk's own objects (the chunk, its snapshot and usage), measured at ~480 bytes: so
# that a stream of tiny reads is bounded too.
CHUNK_COST = 512


class Intake:
    """`Inbox.put_chunk`: what an engine hands its chunks to (`emit`, or the engine
    thread for each yielded one), a `core.engines.base.HoldsBack`: `room`, which a
    producer that can hold back asks after handing some on, is True while the inbox
    holds less than `HELD_BOUND`; False when it holds more, and then `wake` is called
    once, by the next take."""

    __slots__ = ("_put", "room")

    def __init__(self, put: Callable[[Chunk], None],
                 room: Callable[[Callable[[], None]], bool]) -> None:
        self._put = put
        self.room = room

    def __call__(self, chunk: Chunk) -> None:
        self._put(chunk)


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._held = 0  # what the chunks among `_items` hold (`HELD_BOUND`)
        self._on_room: Callable[[], None] | None = None  # a producer held back
        self.put_chunk = Intake(self._put_chunk, self._has_room)
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

    @property
    def held(self) -> int:
        """What the chunks waiting now hold, as `HELD_BOUND` counts it."""
        return self._held

    def _put_chunk(self, chunk: Chunk) -> None:
        """Hand over `chunk`, waking the runner unless it is holding chunks and this one
        leaves the pending text below the flush size."""
        with self._lock:
            self._items.append(chunk)
            self._held += len(chunk.text) + CHUNK_COST
            if not self._waiting:
                return
            if self._room is not None:
                self._room -= len(chunk.text.encode())
                if self._room > 0:
                    return
            self._wake_runner()

    def _has_room(self, wake: Callable[[], None]) -> bool:
        """`Intake.room`; a producer held back wakes the runner, which alone makes room.
        Asked after every read: below the bound it answers without the lock (the one
        asking is the one putting, so meanwhile `_held` can only fall, at a take)."""
        if self._held < HELD_BOUND:
            return True
        with self._lock:
            if self._held < HELD_BOUND:
                return True
            self._on_room = wake
            self._wake_runner()
            return False

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
        return self.take_now()

    def arm(self, room_bytes: int | None) -> bool:
        """`take`'s wait without the waiting: from now, what would end it calls `notify`
        once. False when items already wait (nothing armed: take them now)."""
        with self._lock:
            if self._items:
                return False
            self._waiting, self._room = True, room_bytes
            return True

    def take_now(self) -> list[Any]:
        """Everything handed over so far, without waiting; disarms. A producer held back
        is woken: the inbox is empty again."""
        with self._lock:
            self._waiting = False
            items, self._items = self._items, []
            self._held = 0
            on_room, self._on_room = self._on_room, None
        if on_room is not None:
            on_room()
        return items

    def _wake_runner(self) -> None:
        if self._waiting:
            self._waiting = False
            if self.notify is not None:
                self.notify()
            else:
                self._wake.put(None)
