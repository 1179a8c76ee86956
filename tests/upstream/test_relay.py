"""Each network read made into its chunk on the transport's loop thread and handed to
`emit` (the attempt's inbox), or yielded by `generate` without one: the same chunks in
the same order either way, what a read brought before an error first, and nothing once
`generate` has returned; an attempt that ended leaves its connection to the next."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from core.engines.base import Chunk, EngineError, EngineOptions, GenerationRequest, UpstreamModel
from core.engines.upstream.engine import OpenAIEngine
from core.engines.upstream.routing import Router
from tests.scheduler.processes import free_port
from tests.thread_switches import voluntary_switches
from tests.upstream.scripted import USAGE, Scripted, delta

REQUEST = GenerationRequest([{"role": "user", "content": "count"}], max_output_tokens=16)


def generated(
    server: Scripted, *, emit: bool, should_stop: Callable[[], bool] = lambda: False,
    request: GenerationRequest = REQUEST, emitted: list[tuple[Chunk, str]] | None = None,
) -> tuple[list[Chunk], list[tuple[Chunk, str]], list[tuple[Chunk, str]]]:
    """What `generate` yielded, what it emitted (with the thread), and what was emitted
    after it had returned (given time to come). `emitted`: the list the emitted chunks
    go to as they come, for a `should_stop` that looks at them."""
    entry = UpstreamModel("m", (server.base_url,), "smollm2", None, 8, 10)
    loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
    emitted = [] if emitted is None else emitted

    def collect(chunk: Chunk) -> None:
        emitted.append((chunk, threading.current_thread().name))

    yielded = list(loaded.generate(request, None, should_stop, collect if emit else None))
    returned = len(emitted)
    time.sleep(0.3)
    return yielded, emitted[:returned], emitted[returned:]


def test_reads_are_emitted_from_the_network_thread_in_order(
    scripted: Callable[..., Scripted]
) -> None:
    server = scripted([delta("One"), delta(", two") + delta(", three"), delta("", "stop"), USAGE,
                       b"data: [DONE]\n\n"])
    yielded, emitted, late = generated(server, emit=True)
    assert yielded == [] and late == []
    assert [chunk.text for chunk, _ in emitted] == ["One", ", two, three", ""]
    assert {thread for _, thread in emitted} == {"upstream-http"}
    last = emitted[-1][0]
    assert last.snapshot["text"] == "One, two, three"
    assert (last.usage.input_tokens, last.usage.output_tokens) == (5, 3)


def test_without_emit_the_same_chunks_are_yielded(scripted: Callable[..., Scripted]) -> None:
    reads = [delta("One"), delta(", two") + delta(", three"), delta("", "stop"), USAGE,
             b"data: [DONE]\n\n"]
    emitted = [chunk for chunk, _ in generated(scripted(reads), emit=True)[1]]
    yielded, none, _ = generated(scripted(reads), emit=False)
    assert yielded == emitted and none == []


def test_what_a_read_brought_before_an_in_stream_error_comes_first(
    scripted: Callable[..., Scripted]
) -> None:
    refusal = b'data: {"error": {"code": 400, "message": "no"}}\n\n'
    server = scripted([delta("One"), delta(", two") + refusal + delta(", three")])
    entry = UpstreamModel("m", (server.base_url,), "smollm2", None, 8, 10)
    loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
    emitted: list[str] = []
    with pytest.raises(EngineError) as raised:
        list(loaded.generate(REQUEST, None, lambda: False, lambda chunk: emitted.append(
            chunk.text)))
    assert raised.value.code == "upstream_rejected"
    assert emitted == ["One", ", two"]


@pytest.mark.parametrize("emit", [True, False])
def test_an_upstream_past_max_output_tokens_is_cut_there_and_closed(
    scripted: Callable[..., Scripted], emit: bool
) -> None:
    """A broken upstream that ignores `max_tokens` (a stand-in: real servers stop) would
    have the task store everything it streams: text past the limit's count ends the
    request at once, as finished, without that text."""
    server = scripted([delta(f" w{i}") for i in range(200)] + [delta("", "stop")], pause=0.05)
    request = GenerationRequest([{"role": "user", "content": "count"}], max_output_tokens=3)
    started = time.monotonic()
    yielded, emitted, late = generated(server, emit=emit, request=request)
    chunks = [chunk for chunk, _ in emitted] if emit else yielded
    assert "".join(chunk.text for chunk in chunks) == " w0 w1 w2"
    assert chunks[-1].usage.output_tokens == 3 and late == []
    assert server.closed.wait(2) and time.monotonic() - started < 5  # not after 10 s of reads


def test_text_after_the_finish_reason_is_dropped_and_the_request_closed(
    scripted: Callable[..., Scripted]
) -> None:
    """A broken upstream (a stand-in) that streams on after its `finish_reason`: the
    output ends at the finish and the connection is closed, not read to its end."""
    server = scripted([delta("One"), delta(", two", "stop")] + [delta(" more")] * 200,
                      pause=0.05)
    started = time.monotonic()
    _, emitted, late = generated(server, emit=True)
    assert "".join(chunk.text for chunk, _ in emitted) == "One, two" and late == []
    assert server.closed.wait(2) and time.monotonic() - started < 5  # not after 10 s of reads


def test_a_compressed_answer_is_refused_unread(scripted: Callable[..., Scripted]) -> None:
    """The request asks for no compression (a decompressor inflates a read whole: a
    small read could take the process's memory); a stand-in answering gzip anyway (real
    servers honour `identity`) is refused for good, naming the URL, its body unread."""
    server = scripted([b"\x1f\x8b" + b"\x00" * 64], headers=b"Content-Encoding: gzip\r\n")
    with pytest.raises(EngineError) as raised:
        generated(server, emit=True)
    assert (raised.value.code, raised.value.retryable) == ("upstream_rejected", False)
    assert server.base_url in raised.value.message and "compressed" in raised.value.message


def test_a_stop_ends_the_request_and_nothing_is_emitted_after_it(
    scripted: Callable[..., Scripted]
) -> None:
    server = scripted([delta(f" {n}") for n in range(40)] + [b"data: [DONE]\n\n"], pause=0.02)
    started = time.monotonic()
    stop_at = started + 0.15
    yielded, emitted, late = generated(server, emit=True,
                                       should_stop=lambda: time.monotonic() >= stop_at)
    assert yielded == [] and late == []
    assert 0 < len(emitted) < 40
    assert server.closed.wait(2)  # the connection was closed, not read to its end
    assert time.monotonic() - started < 0.15 + 0.3 + 0.5


def test_a_stop_while_the_upstream_is_silent_ends_the_request_at_once(
    scripted: Callable[..., Scripted]
) -> None:
    """The transport's watch sees the stop (the engine thread itself looks only once a
    second, in case that loop is stuck). The stop comes 0.3 s after the first delta,
    inside the five silent seconds that follow it: timed from the request's start, it
    came before the first delta on a loaded machine (`make test`'s other worker)."""
    server = scripted([delta("One"), delta(" two", "stop"), USAGE, b"data: [DONE]\n\n"],
                      pause=5)
    so_far: list[tuple[Chunk, str]] = []
    first_seen: list[float] = []

    def should_stop() -> bool:
        if so_far and not first_seen:
            first_seen.append(time.monotonic())
        return bool(first_seen) and time.monotonic() >= first_seen[0] + 0.3

    _, emitted, late = generated(server, emit=True, should_stop=should_stop, emitted=so_far)
    assert [chunk.text for chunk, _ in emitted] == ["One"] and late == []
    # The stop, the watch's tick, `generated`'s wait for late chunks, slack.
    assert time.monotonic() - first_seen[0] < 0.3 + 0.3 + 0.4


def test_the_engine_thread_sleeps_while_the_upstream_is_silent(
    scripted: Callable[..., Scripted]
) -> None:
    """Five reads 0.8 s apart: the thread that called `generate` wakes for the end (and
    its safety poll once a second), not 20 times a second to look for a stop (it did,
    ~70 times here)."""
    server = scripted([delta("One"), delta(" two"), delta("", "stop"), USAGE,
                       b"data: [DONE]\n\n"], pause=0.8)
    entry = UpstreamModel("m", (server.base_url,), "smollm2", None, 8, 10)
    loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
    switches: list[int] = []

    def run() -> None:
        me = threading.get_native_id()
        before = voluntary_switches(me)
        list(loaded.generate(REQUEST, None, lambda: False, lambda chunk: None))
        switches.append(voluntary_switches(me) - before)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert switches and switches[0] <= 12, f"the engine thread woke {switches} times"


def test_an_attempt_that_ended_leaves_its_connection_to_the_next(
    scripted: Callable[..., Scripted]
) -> None:
    """The body's end comes a pause after `[DONE]`; the attempt does not wait for it,
    and does not close the connection it is still being read on."""
    server = scripted([delta("One"), delta("", "stop"), USAGE, b"data: [DONE]\n\n"],
                      keep_alive=True)
    for _ in range(3):
        emitted = generated(server, emit=True)[1]
        assert [chunk.text for chunk, _ in emitted] == ["One", ""]
    assert server.connections == 1


def test_a_refused_connection_backs_the_attempt_off_until_its_url_cools_down() -> None:
    """The only URL refuses: the retry waits out the URL's cool-down (docs/upstream.md),
    rather than being claimed inside it and spent without a request."""
    entry = UpstreamModel("m", (f"http://127.0.0.1:{free_port()}/v1",), "smollm2", None, 8, 10)
    loaded = OpenAIEngine(EngineOptions(upstream_cooldown_seconds=7), Router()).load(entry)
    with pytest.raises(EngineError) as refused:
        list(loaded.generate(REQUEST, None, lambda: False))
    assert (refused.value.code, refused.value.retryable) == ("upstream_unavailable", True)
    assert 6 <= (refused.value.retry_after_seconds or 0) <= 7
