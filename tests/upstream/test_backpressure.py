"""An upstream that streams faster than the attempt's runner takes its text (a stand-in
firehose, tests/upstream/firehose.py): the attempt's inbox never holds more than its
bound, the stream stops reading while it is full, so the upstream's writes wait (TCP),
and the text handed on is exactly what the upstream sent. A read costs what it brought:
chunks held together take memory in proportion to their text, not a copy of all the
text so far each."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from core.engines.base import Chunk, EngineOptions, GenerationRequest, UpstreamModel
from core.engines.upstream.engine import OpenAIEngine
from core.engines.upstream.routing import Router
from scheduler.inbox import CHUNK_COST, HELD_BOUND, Inbox
from tests.upstream.firehose import TEXT, Firehose
from tests.upstream.scripted import Scripted, delta

NO_LIMIT = GenerationRequest([{"role": "user", "content": "talk"}])  # max_output_tokens None
# One network read's chunk: a read brings at most 64 KiB (httpcore's read size).
ONE_READ = (1 << 16) + CHUNK_COST
# Where a test stops a stream that the bound did not hold back (without it, each read
# made a copy of all the text so far: the process's memory would go first).
RUNAWAY = 4 << 20


@pytest.fixture
def firehose() -> Iterator[Firehose]:
    server = Firehose()
    yield server
    server.stop()


class Measured:
    """The inbox's intake as the engine sees it, noting what the inbox holds after each
    chunk and all the text handed on."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.most_held = 0
        self.handed_on = 0

    def __call__(self, chunk: Chunk) -> None:
        self.inbox.put_chunk(chunk)
        self.handed_on += len(chunk.text)
        self.most_held = max(self.most_held, self.inbox.held)

    def room(self, wake: Callable[[], None]) -> bool:
        return self.inbox.put_chunk.room(wake)


def stream(base_url: str, emit: Measured, seconds: float) -> threading.Thread:
    """Generate from `base_url` into `emit` on a thread of its own for `seconds` (less
    if the text handed on runs away)."""
    entry = UpstreamModel("m", (base_url,), "smollm2", None, 8, 30)
    loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
    until = time.monotonic() + seconds

    def should_stop() -> bool:
        return time.monotonic() >= until or emit.handed_on > RUNAWAY

    thread = threading.Thread(target=lambda: list(loaded.generate(NO_LIMIT, None, should_stop,
                                                                  emit)))
    thread.start()
    return thread


def test_a_stream_faster_than_its_runner_never_holds_more_than_the_inbox_bound(
    firehose: Firehose,
) -> None:
    """The runner takes what waits every 50 ms (a store that keeps up with less than
    the upstream sends); every chunk it took is the upstream's text, in order."""
    inbox = Inbox()
    emit = Measured(inbox)
    generating = stream(firehose.base_url, emit, seconds=1.5)
    taken: list[Chunk] = []
    while generating.is_alive():
        time.sleep(0.05)
        taken += inbox.take_now()
    taken += inbox.take_now()
    text = "".join(chunk.text for chunk in taken)
    assert emit.handed_on <= RUNAWAY, "the stream was not held back"
    assert emit.most_held <= HELD_BOUND + ONE_READ
    assert len(text) > 4 * HELD_BOUND  # it streamed well past the bound meanwhile
    assert text == TEXT * (len(text) // len(TEXT))
    assert str(taken[-1].snapshot["text"]) == text


def test_while_the_runner_takes_nothing_the_stream_stops_reading_and_the_upstream_waits(
    firehose: Firehose,
) -> None:
    """A runner that takes nothing for two seconds (a store that stalls): what waits
    stays at the bound, and the upstream's connection stops taking its writes once the
    sockets' buffers are full, instead of this process buffering the stream."""
    inbox = Inbox()
    emit = Measured(inbox)
    generating = stream(firehose.base_url, emit, seconds=2.0)
    time.sleep(1.0)
    sent_then = firehose.sent
    time.sleep(0.8)
    sent_later = firehose.sent
    generating.join(10)
    assert emit.handed_on <= RUNAWAY, "the stream was not held back"
    assert emit.most_held <= HELD_BOUND + ONE_READ
    assert sent_later == sent_then > 0


def test_chunks_held_together_take_memory_in_proportion_to_their_text(
    scripted: Callable[..., Scripted],
) -> None:
    """300 reads of 3,200 characters each, all their chunks kept (as a runner that has
    not taken them yet keeps them): each chunk's snapshot still holds the text up to
    it, but no copy of it of its own (with one, these took ~150 MB)."""
    warm = scripted([delta("One", "stop"), b"data: [DONE]\n\n"], pause=0)
    reads = [delta(TEXT) * 50] * 300 + [delta("", "stop"), b"data: [DONE]\n\n"]
    server = scripted(reads, pause=0.002)

    def generated(base_url: str) -> list[Chunk]:
        entry = UpstreamModel("m", (base_url,), "smollm2", None, 8, 30)
        loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
        chunks: list[Chunk] = []
        list(loaded.generate(NO_LIMIT, None, lambda: False, chunks.append))
        return chunks

    generated(warm.base_url)  # the process's client, its pool and TLS context made first
    tracemalloc.start()
    try:
        chunks = generated(server.base_url)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    text = "".join(chunk.text for chunk in chunks)
    assert len(text) == 300 * 50 * len(TEXT)
    assert held < 16 * len(text)
    for k in (0, len(chunks) // 3, len(chunks) - 1):
        assert str(chunks[k].snapshot["text"]) == "".join(c.text for c in chunks[:k + 1])
