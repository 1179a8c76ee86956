"""Where an event stream resumes (docs/events.md): `?after=`, `starting_after` and
`Last-Event-ID` reach up to the largest `seq` a log can hold on either store, one more
is refused alike; and `Last-Event-ID` is read only by a stream."""

from __future__ import annotations

from typing import Any

from core.store.database import Database
from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem
from tests.api.test_events import SSE, finished_task

LARGEST_SEQ = 2**31 - 1  # PostgreSQL's INTEGER, which holds `seq`
# A header is bytes: the Arabic-Indic digit one (which `int` would read) goes as UTF-8.
BAD_LAST_EVENT_IDS: list[str | bytes] = ["1e0", "x", "-1", "2.0", " 5", "١".encode(),
                                         str(LARGEST_SEQ + 1), "9" * 5000]


def resumed_at(task_id: str, seq: int) -> list[tuple[str, dict[str, Any]]]:
    """Every way of asking for the events after `seq`: the route, then its request."""
    events, response = f"/v1/tasks/{task_id}/events", f"/v1/responses/{task_id}"
    return [
        (events, {"params": {"after": seq}}),
        (events, {"params": {"after": seq}, "headers": SSE}),
        (events, {"headers": {**SSE, "Last-Event-ID": str(seq)}}),
        (response, {"params": {"stream": "true", "starting_after": seq}}),
        (response, {"params": {"stream": "true"}, "headers": {"Last-Event-ID": str(seq)}}),
    ]


def test_the_largest_seq_is_a_resume_point_past_the_end(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    for path, request in resumed_at(task_id, LARGEST_SEQ):
        answer = alice.get(path, **request)
        assert answer.status_code == 200, (request, answer.text)
        if answer.headers["content-type"].startswith("text/event-stream"):
            assert answer.text == ""
        else:
            assert answer.json()["data"] == []


def test_one_past_the_largest_seq_is_refused_on_every_store(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    fields = ["after", "after", "last_event_id", "starting_after", "last_event_id"]
    for (path, request), field in zip(resumed_at(task_id, LARGEST_SEQ + 1), fields,
                                      strict=True):
        problem = assert_problem(alice.get(path, **request), 422, "validation_error")
        assert problem["field"] == field, request


def test_a_page_ignores_any_last_event_id(alice: Caller, model_id: str, db: Database) -> None:
    task_id = finished_task(alice, model_id, db)
    plain = alice.get(f"/v1/tasks/{task_id}/events", params={"after": 2}).json()
    for value in BAD_LAST_EVENT_IDS:
        answer = alice.get(f"/v1/tasks/{task_id}/events", params={"after": 2},
                           headers={"Last-Event-ID": value})
        assert (answer.status_code, answer.json()) == (200, plain), value
        response = alice.get(f"/v1/responses/{task_id}", headers={"Last-Event-ID": value})
        assert (response.status_code, response.json()["id"]) == (200, task_id), value


def test_a_stream_refuses_a_last_event_id_that_is_no_seq(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    for value in BAD_LAST_EVENT_IDS:
        for path, headers in [(f"/v1/tasks/{task_id}/events", SSE),
                              (f"/v1/responses/{task_id}?stream=true", {})]:
            answer = alice.get(path, headers={**headers, "Last-Event-ID": value})
            problem = assert_problem(answer, 422, "validation_error")
            assert problem["field"] == "last_event_id", value


def test_a_last_event_id_with_leading_zeros_is_read(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    answer = alice.get(f"/v1/tasks/{task_id}/events",
                       headers={**SSE, "Last-Event-ID": "0000000000004"})
    assert answer.text.startswith("id: 5\n")
