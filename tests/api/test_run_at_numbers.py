"""`run_at` is an RFC 3339 time with an offset: a string of digits is not read as Unix
seconds or milliseconds, on `POST /v1/responses` (docs/http-api.md)."""

from __future__ import annotations

import pytest

from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem


@pytest.mark.parametrize("digits", ["4102444800", "4102444800000", "0", "-1"])
def test_a_run_at_of_digits_is_a_validation_error_naming_run_at(
    alice: Caller, model_id: str, digits: str
) -> None:
    answer = alice.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                               "run_at": digits})
    problem = assert_problem(answer, 422, "validation_error")
    assert [error["field"] for error in problem["errors"]] == ["run_at"]
    assert digits not in problem["detail"]
    assert alice.get("/v1/tasks").json()["data"] == []


def test_a_run_at_with_its_date_and_offset_is_still_accepted(alice: Caller, model_id: str) -> None:
    answer = alice.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                               "run_at": "2100-01-01T01:00:00+01:00"})
    assert answer.status_code == 202, answer.text
    task = alice.get(f"/v1/tasks/{answer.json()['id']}").json()
    assert task["run_at"] == "2100-01-01T00:00:00.000Z"
