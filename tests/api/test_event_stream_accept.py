"""`GET /v1/tasks/{id}/events` answers SSE when `Accept` lists `text/event-stream` as
acceptable, JSON pages otherwise (docs/events.md); the OpenAI route's query decides."""

from __future__ import annotations

from core.store.database import Database
from tests.api.helpers import Caller
from tests.api.test_events import finished_task

ASKS_FOR_A_STREAM = [
    "text/event-stream",
    "TEXT/EVENT-STREAM",
    "Text/Event-Stream; charset=utf-8",
    "application/json, text/event-stream",
    "application/json;q=0.9,text/event-stream;q=0.1",
    "text/event-stream;q=abc",  # an unreadable q is ignored
    "text/event-stream;q=inf",  # Litestar's own `Accept` raises on it
]
ASKS_FOR_JSON = [
    "text/event-stream;q=0",
    "text/event-stream; Q=0.000, application/json",
    "text/event-stream-x",
    "application/text/event-stream",
    "*/*",
    "text/*",
    "application/json",
    "",
]


def test_an_acceptable_event_stream_gets_sse(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    for accept in ASKS_FOR_A_STREAM:
        answer = alice.get(f"/v1/tasks/{task_id}/events", headers={"Accept": accept})
        assert answer.status_code == 200, accept
        assert answer.headers["content-type"].startswith("text/event-stream"), accept
        assert answer.text.startswith("id: 1\n"), accept


def test_anything_else_gets_a_json_page(alice: Caller, model_id: str, db: Database) -> None:
    task_id = finished_task(alice, model_id, db)
    for accept in ASKS_FOR_JSON:
        answer = alice.get(f"/v1/tasks/{task_id}/events", headers={"Accept": accept})
        assert answer.status_code == 200, accept
        assert answer.headers["content-type"].startswith("application/json"), accept
        assert answer.json()["data"][0]["seq"] == 1, accept


def test_the_openai_route_streams_by_its_query_not_by_accept(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = finished_task(alice, model_id, db)
    asked = alice.get(f"/v1/responses/{task_id}", headers={"Accept": "text/event-stream"})
    assert asked.headers["content-type"].startswith("application/json")
    streamed = alice.get(f"/v1/responses/{task_id}?stream=true",
                         headers={"Accept": "application/json"})
    assert streamed.headers["content-type"].startswith("text/event-stream")
