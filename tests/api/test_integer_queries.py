"""An integer query parameter or header is written in decimal digits: `1e1` and `2.0`
are refused as `0x10` is, not read as 10 and 2 (docs/http-api.md)."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem

NOT_DIGITS = ["1e1", "2.0", "0x10", "1_0", "true", "+5", " 5", "١"]


def queued_task(who: Caller, model_id: str) -> str:
    created = who.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                              "run_at": "2100-01-01T00:00:00Z"})
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


def test_a_page_limit_not_in_digits_is_a_validation_error(admin: Caller) -> None:
    for value in NOT_DIGITS:
        for path in ("/v1/tasks", "/v1/clients", "/v1/schedules", "/v1/dead-letters"):
            problem = assert_problem(admin.get(path, params={"limit": value}), 422,
                                     "validation_error")
            assert [error["field"] for error in problem["errors"]] == ["limit"], value


def test_every_integer_of_a_task_read_is_refused_unless_in_digits(
    alice: Caller, model_id: str
) -> None:
    task_id = queued_task(alice, model_id)
    for value in NOT_DIGITS:
        for path, name in [("/v1/tasks", "priority"), (f"/v1/tasks/{task_id}/events", "after"),
                           (f"/v1/tasks/{task_id}/events", "limit"),
                           (f"/v1/responses/{task_id}", "starting_after")]:
            problem = assert_problem(alice.get(path, params={name: value}), 422,
                                     "validation_error")
            assert problem["field"] == name, value


def test_a_last_event_id_not_in_digits_is_a_validation_error(
    alice: Caller, model_id: str
) -> None:
    """On a stream, which resumes by it (a JSON page ignores the header)."""
    task_id = queued_task(alice, model_id)
    answer = alice.get(f"/v1/tasks/{task_id}/events",
                       headers={"Last-Event-ID": "1e0", "Accept": "text/event-stream"})
    assert assert_problem(answer, 422, "validation_error")["field"] == "last_event_id"


def test_digits_are_read_and_a_negative_is_refused_by_its_range(
    alice: Caller, model_id: str
) -> None:
    task_id = queued_task(alice, model_id)
    assert len(alice.get("/v1/tasks", params={"limit": "10"}).json()["data"]) == 1
    events = alice.get(f"/v1/tasks/{task_id}/events", params={"after": "0", "limit": "1"})
    assert [event["seq"] for event in events.json()["data"]] == [1]
    problem = assert_problem(alice.get("/v1/tasks", params={"limit": "-1"}), 422,
                             "validation_error")
    assert problem["errors"][0]["message"] == "Expected `int` >= 1"


def test_an_options_request_is_answered_without_a_token(http: TestClient[Any]) -> None:
    """Litestar answers `OPTIONS` (a CORS preflight) with a handler of its own, which the
    check of integer parameters reads as it reads ours: it once made every `OPTIONS` a
    500."""
    for path in ["/healthz", "/metrics", "/v1/pair", "/v1/tasks", "/v1/tasks/resp_abc/events",
                 "/v1/responses"]:
        answer = http.options(path, headers={"Origin": "https://example.test",
                                             "Access-Control-Request-Method": "GET"})
        assert answer.status_code == 204, path
        assert "GET" in answer.headers["allow"] or "POST" in answer.headers["allow"], path
