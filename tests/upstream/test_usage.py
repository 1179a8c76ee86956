"""A task's token counts are its server's usage: also when the stream goes on after the
answer's finish before the usage comes, and when the answer was continued on another
URL or in a resumed attempt (the continued text is output, not prompt). Each stand-in
here is a one-route HTTP/1.1 server standing for an upstream that answers exactly so."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from core.engines.base import Chunk, EngineOptions, GenerationRequest, UpstreamModel
from core.engines.upstream.engine import SNAPSHOT_VERSION, OpenAIEngine
from core.engines.upstream.routing import Router
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from core.store.tasks import get_response
from tests.scheduler.helpers import output_text, streamed_text
from tests.upstream.helpers import COUNTING, add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.scripted import USAGE, Scripted, delta
from tests.upstream.test_after_finish import ANSWER, StopsAfterFinish, completed_once
from tests.upstream.test_errors import run_until_finished

DONE = b"data: [DONE]\n\n"
AFTER_THE_FINISH = {
    "text": delta(" and then some"),
    "empty delta": delta(""),
    "chunk without choices": b'data: {"choices": []}\n\n',
    "second finish": delta("", "stop"),
}


def usage(prompt_tokens: int, completion_tokens: int) -> bytes:
    chunk = {"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                      "completion_tokens": completion_tokens}}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def delta_counted(text: str, prompt_tokens: int, completion_tokens: int) -> bytes:
    """A delta with the usage so far, as a server reporting usage in every chunk sends."""
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def completed(db: Database, settings: Settings, base_urls: list[str]) -> tuple[str, int, int]:
    """A task run against `base_urls`, which must complete in its first attempt, streamed
    as stored: its output, input tokens and output tokens."""
    add_upstream(db, base_urls)
    [task_id] = enqueue(db)
    run_until_finished(db, settings, task_id, seconds=10)
    response = get_response(db, task_id, None)
    assert (response.status, response.attempts) == (Status.COMPLETED, 1)
    assert output_text(db, task_id) == streamed_text(db, task_id)
    return output_text(db, task_id), response.input_tokens, response.output_tokens


@pytest.mark.parametrize("extra", AFTER_THE_FINISH.values(), ids=AFTER_THE_FINISH.keys())
def test_the_usage_after_more_events_past_the_finish_is_the_tasks(
    db: Database, quick: Settings, scripted: Callable[..., Scripted], extra: bytes
) -> None:
    """Text after the finish cut the read there: the usage behind it was never read, and
    the task showed 0 prompt tokens. That text is still not the answer's."""
    server = scripted([*ANSWER, extra, USAGE, DONE], pause=0.01)

    assert completed(db, quick, [server.base_url]) == ("Complete answer.", 5, 3)


def test_text_after_the_finish_on_a_connection_kept_open_is_not_waited_for(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """Reading on after the finish keeps its bound: a server that streams text after it
    for twenty seconds, without usage or `[DONE]`, holds the attempt about a second."""
    server = scripted([*ANSWER, *[delta(" more")] * 400], pause=0.05)
    completed_once(db, quick, [server.base_url])


def test_text_after_the_finish_then_silence_is_not_waited_for(
    db: Database, quick: Settings
) -> None:
    server = StopsAfterFinish([*ANSWER, delta(" more")], reset=False)
    try:
        completed_once(db, quick, [server.base_url])
        assert server.closed.wait(10)
    finally:
        server.stop()


def test_an_answer_continued_on_another_url_counts_the_original_prompt(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """The first server broke before its usage; the second, continuing "One, two," (two
    deltas: two tokens), counts them in its prompt. The task showed 0 prompt tokens."""
    broken = scripted([delta("One,"), delta(" two,")], pause=0.01)  # no finish: broken
    other = scripted([delta(" three."), delta("", "stop"), usage(22, 1), DONE], pause=0.01)

    assert completed(db, quick, [broken.base_url, other.base_url]) == (
        "One, two, three.", 20, 3)


def test_a_prompt_count_reported_before_the_continuation_stands(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    broken = scripted([delta_counted("One,", 20, 1), delta_counted(" two,", 20, 2)],
                      pause=0.01)
    other = scripted([delta(" three."), delta("", "stop"), usage(25, 1), DONE], pause=0.01)

    assert completed(db, quick, [broken.base_url, other.base_url]) == (
        "One, two, three.", 20, 3)


def test_a_resumed_attempt_counts_the_original_prompt(
    scripted: Callable[..., Scripted],
) -> None:
    """A snapshot of an attempt that stopped before any usage, resumed on a server that
    counts the text so far in its prompt."""
    server = scripted([delta(" three."), delta("", "stop"), usage(22, 1), DONE], pause=0.01)
    entry = UpstreamModel("m", (server.base_url,), "smollm2", None, 8, 30)
    loaded = OpenAIEngine(EngineOptions(), Router()).load(entry)
    snapshot = {"v": SNAPSHOT_VERSION, "text": "One, two,", "output_tokens": 2,
                "input_tokens": 0}
    request = GenerationRequest([{"role": "user", "content": "count"}])

    chunks: list[Chunk] = list(loaded.generate(request, snapshot, lambda: False))

    assert "".join(chunk.text for chunk in chunks) == " three."
    usage_then = chunks[-1].usage
    assert (usage_then.input_tokens, usage_then.output_tokens) == (20, 3)


def streamed_by(llama: LlamaServer, max_tokens: int) -> tuple[list[bytes], int]:
    """The `data:` lines of the server's greedy answer to the tasks' prompt, cut after
    `max_tokens` deltas (without its finish), and the prompt's count it reported."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": COUNTING}],
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
            "max_tokens": max_tokens}
    deltas, prompt_tokens = [], None
    with httpx.stream("POST", f"{llama.base_url}/chat/completions", json=body,
                      timeout=60) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                deltas.append(delta(chunk["choices"][0]["delta"]["content"]))
    assert len(deltas) == max_tokens and prompt_tokens is not None
    return deltas, prompt_tokens


def test_an_answer_llama_server_continued_counts_the_original_prompt(
    db: Database, quick: Settings, scripted: Callable[..., Scripted], llama: LlamaServer
) -> None:
    """A stand-in streams the real server's first six tokens and breaks; the server
    continues them, counting them in its prompt: the task shows the prompt's own count
    (what the server reported for it, asked directly), and every token once as output."""
    first, prompt_tokens = streamed_by(llama, max_tokens=6)
    broken = scripted(first, pause=0.01)
    add_upstream(db, [broken.base_url, llama.base_url])
    [task_id] = enqueue(db, max_output_tokens=12)

    run_until_finished(db, quick, task_id)

    response = get_response(db, task_id, None)
    assert (response.status, response.attempts) == (Status.COMPLETED, 1)
    assert (response.input_tokens, response.output_tokens) == (prompt_tokens, 12)
