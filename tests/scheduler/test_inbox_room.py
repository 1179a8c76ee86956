"""The inbox's bound: below it a producer that asks has room; at it the producer is held
back until the runner's next take, which wakes it once; and a producer held back wakes
a runner that was sleeping through chunks below its flush size."""

from __future__ import annotations

import threading
import time

from core.engines.base import Chunk, Usage
from scheduler.inbox import CHUNK_COST, HELD_BOUND, Inbox

LONG = 10.0


def chunk(text: str) -> Chunk:
    return Chunk(text, {"text": text}, Usage(1, 1))


def fill(inbox: Inbox) -> None:
    """Chunks up to the bound, in reads of 4 KiB."""
    while inbox.held < HELD_BOUND:
        inbox.put_chunk(chunk("x" * 4096))


def test_an_inbox_below_its_bound_has_room() -> None:
    inbox = Inbox()
    inbox.put_chunk(chunk("x" * (HELD_BOUND - 2 * CHUNK_COST)))
    woken: list[None] = []
    assert inbox.held == HELD_BOUND - CHUNK_COST
    assert inbox.put_chunk.room(lambda: woken.append(None))
    inbox.take_now()
    assert woken == []


def test_an_inbox_at_its_bound_holds_its_producer_back_until_the_next_take() -> None:
    inbox = Inbox()
    fill(inbox)
    woken: list[None] = []
    assert not inbox.put_chunk.room(lambda: woken.append(None))
    assert woken == []
    taken = inbox.take_now()
    assert woken == [None] and inbox.held == 0
    assert sum(len(c.text) for c in taken) >= HELD_BOUND - len(taken) * CHUNK_COST
    inbox.take_now()
    assert woken == [None]  # once
    assert inbox.put_chunk.room(lambda: woken.append(None))


def test_a_producer_held_back_wakes_a_runner_sleeping_through_small_chunks() -> None:
    """Tiny reads: the inbox reaches its bound (each chunk counts `CHUNK_COST`) long
    before their text reaches the runner's flush size."""
    inbox = Inbox()

    def produce() -> None:
        time.sleep(0.05)
        for _ in range(4 * HELD_BOUND // CHUNK_COST):  # never held back: a failure
            if not inbox.put_chunk.room(lambda: None):
                return
            inbox.put_chunk(chunk("x"))

    producer = threading.Thread(target=produce)
    producer.start()
    started = time.monotonic()
    taken = inbox.take(LONG, room_bytes=HELD_BOUND)
    producer.join()
    assert time.monotonic() - started < LONG / 2
    assert len(taken) >= HELD_BOUND // (CHUNK_COST + 1)
