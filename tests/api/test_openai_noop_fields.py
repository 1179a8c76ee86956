"""OpenAI's request fields that ask for what taskward does anyway (docs/http-api.md):
taken at those values as no-ops, refused at any other naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from core.store.database import Database
from core.tables import schedules, tasks
from tests.api.helpers import Caller

PROMPT = "words=3 prompt-7f3a"
SECRET = "secret-91c4"
# What a response object shows of these fields: what taskward does.
SHOWN = {"text": {"format": {"type": "text"}}, "tool_choice": "none", "tools": [],
         "parallel_tool_calls": False}
ACCEPTED: list[tuple[str, Any]] = [
    ("store", True), ("store", None), ("tools", []), ("tool_choice", "none"),
    ("tool_choice", "auto"), ("parallel_tool_calls", True), ("parallel_tool_calls", False),
    ("text", {"format": {"type": "text"}}), ("truncation", "disabled"), ("include", []),
    ("text", {"format": {"type": "text"}, "verbosity": "medium"}), ("user", "user-42"),
]
REFUSED: list[tuple[str, Any]] = [
    ("store", False), ("store", 1), ("tools", [{"type": "function", "name": SECRET}]),
    ("tool_choice", "required"), ("tool_choice", {"type": "function", "name": SECRET}),
    ("parallel_tool_calls", "yes"), ("text", {"format": {"type": "json_object"}}),
    ("text", {"format": {"type": "text"}, "verbosity": SECRET}), ("truncation", "auto"),
    ("include", [SECRET]), ("user", "x" * 257), ("user", f"{SECRET}\n"),
]
ONLY = {"store": "only true", "tools": "only []", "tool_choice": 'only "none" or "auto"',
        "text": 'only {"format": {"type": "text"}} or {"format": {"type": "text"}, '
                '"verbosity": "medium"}', "truncation": 'only "disabled"',
        "include": "only []"}


def create(who: Caller, model_id: str, **fields: Any) -> Any:
    headers = fields.pop("headers", None)
    return who.post("/v1/responses", headers=headers,
                    json={"model": model_id, "input": PROMPT, "seed": 7, **fields})


def stored_request(db: Database, task_id: str) -> str:
    with db.read() as conn:
        return str(conn.execute(select(tasks.c.request_json)
                                .where(tasks.c.id == task_id)).scalar_one())


def shown(answer: Any) -> dict[str, Any]:
    """A response object without what differs between two tasks."""
    return {key: value for key, value in answer.json().items()
            if key not in ("id", "created_at")}


def assert_same_as_without(db: Database, who: Caller, model_id: str,
                           **fields: Any) -> None:
    plain = create(who, model_id)
    sent = create(who, model_id, **fields)
    assert (plain.status_code, sent.status_code) == (202, 202), sent.text
    assert stored_request(db, sent.json()["id"]) == stored_request(db, plain.json()["id"])
    assert shown(sent) == shown(plain)


@pytest.mark.parametrize(("field", "value"), ACCEPTED)
def test_a_no_op_at_a_value_taskward_does_is_stored_as_without_it(
    db: Database, alice: Caller, model_id: str, field: str, value: Any
) -> None:
    assert_same_as_without(db, alice, model_id, **{field: value})


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_no_op_at_another_value_is_422_naming_the_field(
    alice: Caller, model_id: str, field: str, value: Any
) -> None:
    answer = create(alice, model_id, **{field: value})
    problem = answer.json()
    assert (answer.status_code, problem["code"], problem["field"]) == (
        422, "validation_error", field)
    assert ONLY.get(field, "") in problem["detail"]
    assert "Extra inputs" not in problem["detail"]  # refused for its value, not as unknown
    assert SECRET not in answer.text and "prompt-7f3a" not in answer.text
    assert alice.get("/v1/tasks").json()["data"] == []


def test_the_fields_a_response_object_shows_can_be_sent_back(
    db: Database, alice: Caller, model_id: str
) -> None:
    first = create(alice, model_id).json()
    echoed = {field: first[field] for field in SHOWN}
    assert echoed == SHOWN
    assert_same_as_without(db, alice, model_id, **echoed)


def test_a_replay_compares_the_body_as_sent_no_ops_included(
    alice: Caller, model_id: str
) -> None:
    first = create(alice, model_id, store=True, headers={"Idempotency-Key": "k-1"})
    again = create(alice, model_id, store=True, headers={"Idempotency-Key": "k-1"})
    assert (again.headers["idempotent-replayed"], again.content) == ("true", first.content)
    without = create(alice, model_id, headers={"Idempotency-Key": "k-1"})
    assert (without.status_code, without.json()["code"]) == (422, "idempotency_key_reused")


def test_a_schedule_takes_them_and_keeps_its_request_without_them(
    db: Database, alice: Caller, model_id: str
) -> None:
    def schedule(**fields: Any) -> Any:
        return alice.post("/v1/schedules", json={"cron": "0 0 * * *", "request": {
            "model": model_id, "input": PROMPT, **fields}})

    plain, sent = schedule(), schedule(**SHOWN, store=True, include=[], user="u")
    assert (plain.status_code, sent.status_code) == (201, 201), sent.text
    assert sent.json()["request"] == plain.json()["request"]
    with db.read() as conn:
        kept = {row.request_json for row in conn.execute(select(schedules.c.request_json))}
    assert len(kept) == 1
    refused = schedule(truncation="auto")
    assert (refused.status_code, refused.json()["field"]) == (422, "request.truncation")
