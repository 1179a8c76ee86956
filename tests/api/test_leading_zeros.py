"""An integer query parameter with a leading zero (`05`) is refused with words that say
so (docs/http-api.md): msgspec refused it as "Expected `int`, got `str`", which named
no reason a client could act on."""

from __future__ import annotations

import pytest

from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem
from tests.api.test_integer_queries import queued_task

WITHOUT_ZEROS = "must be an integer written in decimal digits, without leading zeros"


@pytest.mark.parametrize(("path", "name", "value"), [
    ("/v1/tasks", "limit", "02"),
    ("/v1/tasks", "priority", "05"),
    ("/v1/tasks", "limit", "-01"),
])
def test_a_query_integer_with_a_leading_zero_is_refused_saying_so(
    alice: Caller, path: str, name: str, value: str
) -> None:
    problem = assert_problem(alice.get(path, params={name: value}), 422, "validation_error")
    assert problem["errors"] == [{"field": name, "message": WITHOUT_ZEROS}]


def test_event_positions_with_a_leading_zero_are_refused_saying_so(
    alice: Caller, model_id: str
) -> None:
    task_id = queued_task(alice, model_id)
    for path, name in [(f"/v1/tasks/{task_id}/events", "after"),
                       (f"/v1/responses/{task_id}?stream=true", "starting_after")]:
        problem = assert_problem(alice.get(path, params={name: "01"}), 422,
                                 "validation_error")
        assert problem["errors"] == [{"field": name, "message": WITHOUT_ZEROS}]


def test_zero_itself_and_plain_digits_are_read(alice: Caller, model_id: str) -> None:
    queued_task(alice, model_id)
    assert alice.get("/v1/tasks", params={"limit": "10"}).status_code == 200
    assert alice.get("/v1/tasks", params={"priority": "0"}).status_code == 200
