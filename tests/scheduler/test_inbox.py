"""The runner's inbox: chunks that leave pending text below the flush size are held
without waking the runner; the first chunk, a chunk reaching the size and every other
item wake it at once; nothing is lost or reordered."""

from __future__ import annotations

import threading
import time
from typing import Any

from core.engines.base import Chunk, Usage
from scheduler.inbox import Inbox

LONG = 10.0  # a wait that only a wake-up ends within the test's patience


def chunk(text: str) -> Chunk:
    return Chunk(text, {"text": text}, Usage(1, 1))


def later(action: Any, *items: Any, delay: float = 0.05) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        for item in items:
            action(item)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def timed_take(inbox: Inbox, timeout: float, room: int | None) -> tuple[list[Any], float]:
    started = time.monotonic()
    items = inbox.take(timeout, room_bytes=room)
    return items, time.monotonic() - started


def test_with_nothing_pending_a_chunk_wakes_the_runner_at_once() -> None:
    inbox = Inbox()
    thread = later(inbox.put_chunk, chunk("a"))
    items, waited = timed_take(inbox, LONG, None)
    thread.join()
    assert [item.text for item in items] == ["a"]
    assert waited < LONG / 2


def test_chunks_below_the_room_are_held_until_the_wait_ends() -> None:
    inbox = Inbox()
    held = [chunk("ab"), chunk(""), chunk("cd")]  # 4 bytes (and a usage-only chunk) of 5
    thread = later(inbox.put_chunk, *held)
    items, waited = timed_take(inbox, 0.5, 5)
    thread.join()
    assert items == held
    assert waited >= 0.45


def test_a_chunk_reaching_the_room_wakes_the_runner_at_once() -> None:
    inbox = Inbox()
    sent = [chunk("ab"), chunk("cde")]
    thread = later(inbox.put_chunk, *sent)
    items, waited = timed_take(inbox, LONG, 5)
    thread.join()
    assert items == sent  # the second is in before the wake-up it causes
    assert waited < LONG / 2


def test_other_items_wake_a_runner_holding_chunks() -> None:
    inbox = Inbox()
    ended = object()
    thread = later(lambda item: (inbox.put_chunk if isinstance(item, Chunk) else inbox.put)(item),
                   chunk("a"), ended)
    items: list[Any] = []
    started = time.monotonic()
    while ended not in items:
        items += inbox.take(LONG, room_bytes=100)
    thread.join()
    assert items[-1] is ended and [i.text for i in items[:-1]] == ["a"]
    assert time.monotonic() - started < LONG / 2


def test_items_already_there_are_taken_without_waiting() -> None:
    inbox = Inbox()
    inbox.put_chunk(chunk("a"))
    inbox.put("x")
    items, waited = timed_take(inbox, LONG, 100)
    assert [getattr(item, "text", item) for item in items] == ["a", "x"]
    assert waited < 1.0
    assert inbox.take(0, room_bytes=None) == []


def test_many_chunks_from_another_thread_all_arrive_in_order() -> None:
    inbox = Inbox()
    sent = [chunk(str(i)) for i in range(2000)]
    thread = later(inbox.put_chunk, *sent, delay=0)
    got: list[Any] = []
    while len(got) < len(sent):
        got += inbox.take(0.01, room_bytes=None if not got else 50)
    thread.join()
    assert got == sent
