"""An answer that calls a tool is not an empty completion: taskward sends no tools and
stores text only, so the task fails `upstream_rejected` at once (the same request would
be answered the same way), its message naming the URL and what came, never the call.
The stand-in server stands for an upstream whose model calls tools unasked."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from core.engines.base import EngineError
from core.engines.upstream.protocol import REJECTED, Piece, parse_chunk
from core.settings import Settings
from core.states import Status
from core.store.database import Database
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.scripted import USAGE, Scripted
from tests.upstream.test_errors import run_until_finished

URL = "http://upstream.test/v1"


def choice_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


CALL = [
    choice_chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": ""}}]}),
    choice_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}),
    choice_chunk({}, "tool_calls"),
    USAGE,
    b"data: [DONE]\n\n",
]


def test_an_answer_of_tool_calls_alone_fails_the_task_at_once(
    db: Database, quick: Settings, scripted: Callable[..., Scripted]
) -> None:
    """It completed with empty text, as if the model had nothing to say."""
    server = scripted(CALL, pause=0.01)
    add_upstream(db, [server.base_url])
    [task_id] = enqueue(db, max_attempts=3)

    run_until_finished(db, quick, task_id, seconds=10)

    row = task_row(db, task_id)
    assert (row.status, row.attempts, row.error_code) == (Status.FAILED, 1, REJECTED)
    assert row.error_message == (f"upstream {server.base_url} answered with a tool call, "
                                 "which taskward does not support (its answers are text)")


@pytest.mark.parametrize("choice", [
    {"delta": {"function_call": {"name": "get_weather", "arguments": ""}}},
    {"delta": {}, "finish_reason": "tool_calls"},
    {"delta": {}, "finish_reason": "function_call"},
    {"delta": {"content": "Let me look.", "tool_calls": [{"index": 0}]}},
], ids=["legacy function_call", "tool_calls finish", "function_call finish", "after text"])
def test_every_form_of_a_tool_call_is_refused(choice: dict[str, Any]) -> None:
    with pytest.raises(EngineError) as raised:
        parse_chunk({"choices": [{"index": 0, **choice}]}, URL)
    assert (raised.value.code, raised.value.retryable) == (REJECTED, False)
    assert "get_weather" not in raised.value.message


@pytest.mark.parametrize("delta", [{"content": "Hi", "tool_calls": []},
                                   {"content": "Hi", "tool_calls": None},
                                   {"content": "Hi", "function_call": None}],
                         ids=["empty list", "null", "null function_call"])
def test_an_empty_tool_calls_field_is_no_call(delta: dict[str, Any]) -> None:
    """Some servers send the field empty in every delta of a text answer."""
    assert parse_chunk({"choices": [{"index": 0, "delta": delta}]}, URL) == Piece("Hi")
