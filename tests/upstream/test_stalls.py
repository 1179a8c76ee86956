"""A stream that keeps sending but generates nothing times out like a silent one: no
tokens for the entry's `timeout_seconds` is a read timeout (retryable, the URL cooled
down), however many empty events, keep-alive comments or empty deltas come meanwhile.
Each used to reset the read timeout and hold the attempt until the task's own timeout.
A slow prefill, slow generation, a reasoning model thinking and a stream this side
holds back are not stalls. The stand-ins are one-route HTTP/1.1 servers standing for
an upstream (or a proxy before one) that answers exactly so."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import pytest

from core.engines.base import Chunk, EngineError, EngineOptions, GenerationRequest, UpstreamModel
from core.engines.upstream.engine import OpenAIEngine
from core.engines.upstream.protocol import UNAVAILABLE
from core.engines.upstream.routing import Router
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.scheduler.helpers import output_text, streamed_text
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.scripted import USAGE, LoopServer, Scripted, chunk, delta, read_request
from tests.upstream.test_errors import retry_messages, run_until_finished

TIMEOUT = 0.5
# The timeout of the entries that must not stall: the stand-in shares this process, so
# a loaded machine delays its writes by a few hundred milliseconds.
PATIENT = 1.5
DONE = b"data: [DONE]\n\n"
ROLE = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
NO_TOKENS = {"empty events": b"data: {}\n\n", "keep-alive comments": b": keep-alive\n\n",
             "empty deltas": delta(""), "a role alone": ROLE}
REQUEST = GenerationRequest([{"role": "user", "content": "count"}])


def thinking(text: str) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": text},
                          "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


@pytest.mark.parametrize("beat", NO_TOKENS.values(), ids=NO_TOKENS.keys())
def test_a_stream_without_tokens_times_out_after_the_entrys_timeout(
    db: Database, quick: Settings, scripted: Callable[..., Scripted], beat: bytes
) -> None:
    """Twenty seconds of events every 50 ms and no token, from the first byte on."""
    server = scripted([beat] * 400, pause=0.05)
    started = time.monotonic()

    messages = retry_messages(db, quick, server.base_url, timeout_seconds=TIMEOUT)

    assert messages == [f"upstream {server.base_url}: no tokens for 0.5 s"]
    assert time.monotonic() - started < 8  # two attempts, each about the timeout


def test_a_stream_that_stops_generating_times_out(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    server = scripted([delta("One"), delta(" two"), *[b"data: {}\n\n"] * 400], pause=0.05)

    messages = retry_messages(db, quick, server.base_url, timeout_seconds=TIMEOUT)

    assert messages == [f"upstream {server.base_url}: no tokens for 0.5 s"]


def generate(base_url: str, router: Router, timeout_seconds: float = TIMEOUT,
             emit: Callable[[Chunk], None] | None = None,
             should_stop: Callable[[], bool] = lambda: False) -> list[Chunk]:
    """What the engine generates from `base_url` alone (an entry of `timeout_seconds`)."""
    entry = UpstreamModel("m", (base_url,), "smollm2", None, 8, timeout_seconds)
    loaded = OpenAIEngine(EngineOptions(upstream_cooldown_seconds=10), router).load(entry)
    return list(loaded.generate(REQUEST, None, should_stop, emit))


def test_a_stalled_stream_cools_its_url_down_as_a_read_timeout_does(
    scripted: Callable[..., Scripted],
) -> None:
    server = scripted([b"data: {}\n\n"] * 400, pause=0.05)
    router = Router()

    with pytest.raises(EngineError) as raised:
        generate(server.base_url, router)

    assert (raised.value.code, raised.value.retryable) == (UNAVAILABLE, True)
    assert router.cooldown_left_seconds((server.base_url,)) > 5


class SlowServer(LoopServer):
    """Sends its answer's head at once, then nothing for `prefill` seconds, then
    `words` deltas `gap` seconds apart, its finish and its usage."""

    def __init__(self, prefill: float, gap: float, words: int) -> None:
        self.prefill, self.gap, self.words = prefill, gap, words
        super().__init__()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(self.prefill)
        for n in range(self.words):
            writer.write(chunk(delta(f" w{n}")))
            await writer.drain()
            await asyncio.sleep(self.gap)
        writer.write(chunk(delta("", "stop") + USAGE + DONE) + b"0\r\n\r\n")
        await writer.drain()
        writer.close()


def test_a_slow_prefill_and_slow_generation_within_the_timeout_complete(
    db: Database, quick: Settings
) -> None:
    """Each silence shorter than the timeout, all of them together over twice as long."""
    server = SlowServer(prefill=0.9, gap=0.6, words=5)
    try:
        add_upstream(db, [server.base_url], timeout_seconds=PATIENT)
        [task_id] = enqueue(db)
        run_until_finished(db, quick, task_id, seconds=15)
    finally:
        server.stop()

    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == streamed_text(db, task_id) == " w0 w1 w2 w3 w4"


def test_a_reasoning_model_thinking_longer_than_the_timeout_completes(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """Its thinking is not stored, but it is tokens generated: three seconds of it."""
    server = scripted([*[thinking("hmm ")] * 20, delta("Twenty."), delta("", "stop"), USAGE,
                       DONE], pause=0.15)
    add_upstream(db, [server.base_url], timeout_seconds=PATIENT)
    [task_id] = enqueue(db)

    run_until_finished(db, quick, task_id, seconds=15)

    row = task_row(db, task_id)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == "Twenty."


class HoldsBackOnce:
    """An attempt's inbox that says it is full after the first chunk and takes more
    again `seconds` later (a store that stalls for that long)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.chunks: list[Chunk] = []
        self.held = False

    def __call__(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)

    def room(self, wake: Callable[[], None]) -> bool:
        if self.held:
            return True
        self.held = True
        threading.Timer(self.seconds, wake).start()
        return False


def test_a_stream_held_back_longer_than_the_timeout_is_no_stall(
    scripted: Callable[..., Scripted],
) -> None:
    """While this side reads nothing the server is not silent: this side is slow."""
    server = scripted([delta("w ")] * 120, pause=0.05)  # six seconds of text
    emit = HoldsBackOnce(seconds=2 * PATIENT)
    until = time.monotonic() + 3 * PATIENT

    generate(server.base_url, Router(), timeout_seconds=PATIENT, emit=emit,
             should_stop=lambda: time.monotonic() >= until)  # ends without an error

    assert len(emit.chunks) > 2  # read on after the hold
