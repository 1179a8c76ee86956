"""OpenAI's multi-turn pattern with the SDK, unchanged: a previous response's output
sent back as input, as the SDK's objects or as their dumps (docs/http-api.md)."""

from __future__ import annotations

from typing import Any

import openai

from tests.engines import expected_text
from tests.openai.conftest import MODEL
from tests.openai.test_sdk import create, settled

FOLLOW_UP = {"role": "user", "content": "words=2"}


def test_a_previous_output_is_taken_back_as_input(sdk: openai.OpenAI) -> None:
    previous = settled(sdk, create(sdk, "words=3").id)
    assert previous.output_text == expected_text(3)
    inputs: list[list[Any]] = [
        [*previous.output, FOLLOW_UP],
        [*(item.model_dump() for item in previous.output), FOLLOW_UP],
        [*(item.model_dump(exclude_none=True) for item in previous.output), FOLLOW_UP],
    ]
    for sent in inputs:
        follow_up = sdk.responses.create(model=MODEL, input=sent, background=True)
        assert settled(sdk, follow_up.id).output_text == expected_text(2)
