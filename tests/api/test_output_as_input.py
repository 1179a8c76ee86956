"""A previous response's output sent back as input, OpenAI's multi-turn pattern
(`input=[*previous.output, {"role": "user", ...}]`): the fields only an output item
carries are taken at their OpenAI types and left out of the stored request; a value of
another type is a 422 naming its path as the client wrote it (docs/http-api.md)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import ResponseOutputMessage

from core.store.database import Database
from tests.api.helpers import Caller, complete_due
from tests.api.test_errors import assert_problem
from tests.api.test_openai_noop_fields import stored_request

FOLLOW_UP = {"role": "user", "content": "words=2"}


def finished_output(db: Database, who: Caller, model_id: str) -> list[dict[str, Any]]:
    """The output items of a completed response, as `GET /v1/responses/{id}` shows them."""
    created = who.post("/v1/responses", json={"model": model_id, "input": "words=3"})
    assert created.status_code == 202, created.text
    complete_due(db)
    output: list[dict[str, Any]] = who.get(f"/v1/responses/{created.json()['id']}").json()[
        "output"]
    assert [item["type"] for item in output] == ["message"]
    return output


def create(who: Caller, model_id: str, messages: list[dict[str, Any]]) -> Any:
    return who.post("/v1/responses", json={"model": model_id, "input": messages, "seed": 7})


def as_text_only(item: dict[str, Any]) -> dict[str, Any]:
    """The same message with only what a model is given of it."""
    return {"type": "message", "role": item["role"],
            "content": [{"type": part["type"], "text": part["text"]}
                        for part in item["content"]]}


def test_own_output_sent_back_is_stored_as_its_text(
    db: Database, alice: Caller, model_id: str
) -> None:
    [item] = finished_output(db, alice, model_id)
    assert {"id", "status"} <= item.keys() and "annotations" in item["content"][0]
    sent = create(alice, model_id, [item, FOLLOW_UP])
    plain = create(alice, model_id, [as_text_only(item), FOLLOW_UP])
    assert (sent.status_code, plain.status_code) == (202, 202), sent.text
    assert stored_request(db, sent.json()["id"]) == stored_request(db, plain.json()["id"])


def test_the_openai_sdks_dump_of_the_output_is_taken(
    db: Database, alice: Caller, model_id: str
) -> None:
    """`model_dump()` adds `phase: null` to the message and `logprobs: null` to its
    text; the JSON dump leaves them out."""
    [item] = finished_output(db, alice, model_id)
    message = ResponseOutputMessage.model_validate(item)
    dumped = message.model_dump()
    assert "phase" in dumped and "logprobs" in dumped["content"][0]
    for form in (dumped, message.model_dump(mode="json", exclude_none=True)):
        answer = create(alice, model_id, [form, FOLLOW_UP])
        assert answer.status_code == 202, answer.text


@pytest.mark.parametrize(("where", "value", "field"), [
    ("status", 5, "input.0.status"),
    ("status", "done", "input.0.status"),
    ("id", ["msg_1"], "input.0.id"),
    ("phase", "final", "input.0.phase"),
    ("annotations", "none", "input.0.content.0.annotations"),
    ("logprobs", {"token": "a"}, "input.0.content.0.logprobs"),
    ("unknown", 1, "input.0.unknown"),
])
def test_such_a_field_of_another_type_is_422_at_its_path(
    db: Database, alice: Caller, model_id: str, where: str, value: object, field: str
) -> None:
    [item] = finished_output(db, alice, model_id)
    part = item["content"][0]
    if where in ("annotations", "logprobs"):
        item = {**item, "content": [{**part, where: value}]}
    else:
        item = {**item, where: value}
    problem = assert_problem(create(alice, model_id, [item, FOLLOW_UP]), 422,
                             "validation_error")
    assert [error["field"] for error in problem["errors"]] == [field]


def test_a_fault_deep_in_the_input_is_named_at_its_path(alice: Caller, model_id: str) -> None:
    """Not behind the text branch of `input` (`input.str`: not a string)."""
    problem = assert_problem(create(alice, model_id, [{"role": "user", "content": [
        {"type": "input_text", "text": 5}]}]), 422, "validation_error")
    assert [error["field"] for error in problem["errors"]] == ["input.0.content.0.text"]
    neither = alice.post("/v1/responses", json={"model": model_id, "input": 5})
    assert assert_problem(neither, 422, "validation_error")["errors"] == [
        {"field": "input", "message": "Input should be a string or a list"}]
