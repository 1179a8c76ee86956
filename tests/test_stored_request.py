"""`generation_request`: an engine's request read back from what a task stored."""

from __future__ import annotations

import pytest

from core.engines.base import GenerationRequest
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.stored_request import generation_request

SETTINGS = Settings(database_url="sqlite:///unused.db")


def stored(**fields: object) -> str:
    """What `POST /v1/responses` stores for a body: validated by the request model."""
    request = ResponseRequest.model_validate({"model": "m", **fields})
    return new_task(request, client_id="c", settings=SETTINGS).request_json


def test_a_text_input_with_instructions_and_sampling_reaches_the_engine() -> None:
    request = generation_request(stored(input="hi", instructions="be brief",
                                        max_output_tokens=7, temperature=0.5, top_p=0.9,
                                        seed=42, metadata={"k": "v"}, priority=3))
    assert request == GenerationRequest(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_output_tokens=7, temperature=0.5, top_p=0.9, seed=42)


def test_messages_keep_their_order_and_parts_are_joined() -> None:
    request = generation_request(stored(input=[
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "one, "}, {"text": "two"}]},
        {"role": "assistant", "content": "three"},
    ]))
    assert request.messages == [{"role": "system", "content": "rules"},
                                {"role": "user", "content": "one, two"},
                                {"role": "assistant", "content": "three"}]
    assert request.temperature is None and request.max_output_tokens is None
    assert isinstance(request.seed, int)  # drawn for the task when it was stored


def test_an_integral_temperature_is_read_as_a_float() -> None:
    assert generation_request('{"input": "hi", "temperature": 1}').temperature == 1.0


@pytest.mark.parametrize("text", [
    '{"input": 42}', '{"instructions": "no input"}', '{"input": []}', "[]", "not json",
    '{"input": [{"role": "robot", "content": "x"}]}', '{"input": "hi", "seed": true}',
    '{"input": "hi", "max_output_tokens": 1.5}', '{"input": [{"role": "user"}]}',
])
def test_a_body_it_cannot_read_raises_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        generation_request(text)
