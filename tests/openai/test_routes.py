"""The OpenAI-compatible routes on an existing response, through the app itself:
streams chosen by the query, cancel and delete with their error paths, event shapes
(docs/http-api.md), and the claim order of an API `run_at` in the past."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from litestar.testing import TestClient

from core.store import claims, worker_writes
from core.store.database import Database
from handlers import sse
from tests.api.helpers import Caller, caller, start_due
from tests.openai.in_process import sdk_over
from tests.openai.worker import claim_one, complete_one, write_attempt


def create(who: Caller, model_id: str, **fields: Any) -> str:
    body = {"model": model_id, "input": "words=3", **fields}
    return str(who.post("/v1/responses", json=body).json()["id"])


def sse_events(text: str) -> list[dict[str, Any]]:
    """The `data` of each SSE block, with its `id`."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line
                      and not line.startswith(":"))
        if "data" in fields:
            events.append({"id": int(fields["id"]), **json.loads(fields["data"])})
    return events


def test_the_stream_query_parameter_decides_not_accept(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    answer = alice.get(f"/v1/responses/{task_id}", params={"stream": "true"},
                       headers={"Accept": "application/json"})
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = sse_events(answer.text)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == [e["id"] for e in events]


def test_starting_after_gives_exactly_the_events_after_it(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    answer = alice.get(f"/v1/responses/{task_id}?stream=true&starting_after=3")
    last_seq = alice.get(f"/v1/tasks/{task_id}").json()["last_seq"]
    assert [e["sequence_number"] for e in sse_events(answer.text)] == list(range(4, last_seq + 1))


def test_last_event_id_counts_as_starting_after_and_wins(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    answer = alice.get(f"/v1/responses/{task_id}?stream=true&starting_after=1",
                       headers={"Last-Event-ID": "5"})
    assert sse_events(answer.text)[0]["sequence_number"] == 6


def test_without_stream_the_object_is_answered(alice: Caller, model_id: str) -> None:
    task_id = create(alice, model_id)
    answer = alice.get(f"/v1/responses/{task_id}?starting_after=3")
    assert answer.headers["content-type"].startswith("application/json")
    assert (answer.json()["id"], answer.json()["status"]) == (task_id, "queued")


def test_another_clients_response_is_404_on_every_route(
    alice: Caller, bob: Caller, model_id: str
) -> None:
    task_id = create(alice, model_id)
    assert bob.get(f"/v1/responses/{task_id}?stream=true").status_code == 404
    assert bob.post(f"/v1/responses/{task_id}/cancel").status_code == 404
    assert bob.delete(f"/v1/responses/{task_id}").status_code == 404
    assert alice.get(f"/v1/responses/{task_id}").json()["status"] == "queued"


def test_cancelling_a_queued_response_answers_200_cancelled(alice: Caller, model_id: str) -> None:
    answer = alice.post(f"/v1/responses/{create(alice, model_id)}/cancel")
    assert (answer.status_code, answer.json()["status"]) == (200, "cancelled")


def test_cancelling_a_running_response_answers_200_in_progress(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    start_due(db)
    answer = alice.post(f"/v1/responses/{task_id}/cancel")
    assert (answer.status_code, answer.json()["status"]) == (200, "in_progress")
    assert alice.get(f"/v1/tasks/{task_id}").json()["status"] == "cancelling"


def test_cancelling_a_finished_response_answers_it_unchanged(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    before = alice.get(f"/v1/tasks/{task_id}").json()
    answer = alice.post(f"/v1/responses/{task_id}/cancel")
    current = alice.get(f"/v1/responses/{task_id}").json()
    assert (answer.status_code, answer.json()) == (200, current)
    assert alice.get(f"/v1/tasks/{task_id}").json() == before


def test_deleting_a_finished_response_answers_the_deletion_object(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    answer = alice.delete(f"/v1/responses/{task_id}")
    assert (answer.status_code, answer.json()) == (
        200, {"id": task_id, "object": "response.deleted", "deleted": True})
    assert alice.get(f"/v1/responses/{task_id}").status_code == 404
    assert alice.get(f"/v1/tasks/{task_id}/events").status_code == 404


def test_deleting_an_active_response_is_409_and_not_retried(alice: Caller, model_id: str) -> None:
    task_id = create(alice, model_id)
    answer = alice.delete(f"/v1/responses/{task_id}")
    assert (answer.status_code, answer.json()["code"]) == (409, "task_not_finished")
    assert answer.headers["x-should-retry"] == "false"
    assert alice.get(f"/v1/responses/{task_id}").json()["status"] == "queued"


def test_deleting_and_cancelling_need_tasks_cancel(
    db: Database, http: TestClient[Any], alice: Caller, model_id: str
) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    submitter = caller(db, http, "responses:create", "tasks:read")
    assert submitter.delete(f"/v1/responses/{task_id}").status_code == 403
    assert submitter.post(f"/v1/responses/{task_id}/cancel").status_code == 403
    assert alice.get(f"/v1/responses/{task_id}").status_code == 200


def test_a_failed_event_carries_its_error_in_the_response_only(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    [claim] = start_due(db)
    worker_writes.fail(db, task_id, claim.owner_token, "bad_request", "injected failure")
    failed = sse_events(alice.get(f"/v1/responses/{task_id}?stream=true").text)[-1]
    assert failed["type"] == "response.failed" and "error" not in failed
    assert failed["response"]["error"] == {"code": "bad_request", "message": "injected failure"}
    assert failed["dead_lettered"] is False


def test_text_events_carry_logprobs(alice: Caller, model_id: str, db: Database) -> None:
    task_id = create(alice, model_id)
    complete_one(db)
    events = sse_events(alice.get(f"/v1/responses/{task_id}?stream=true").text)
    text_events = [e for e in events if e["type"].startswith("response.output_text.")]
    assert len(text_events) == 2 and all(e["logprobs"] == [] for e in text_events)


def test_a_run_at_in_the_past_does_not_jump_the_queue(alice: Caller, model_id: str,
                                                     db: Database) -> None:
    waiting = create(alice, model_id)
    create(alice, model_id, run_at="2000-01-01T00:00:00Z")
    [first] = claims.claim(db, limit=1, lease_ms=60_000, node_id="test-worker")
    assert first.task_id == waiting


def test_output_cut_short_by_a_failure_is_incomplete(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    claim = claim_one(db)
    write_attempt(db, claim, 1, finish=False)
    worker_writes.fail(db, task_id, claim.owner_token, "bad_request", "injected failure")
    [message] = alice.get(f"/v1/responses/{task_id}").json()["output"]
    assert (message["status"], message["content"][0]["text"]) == ("incomplete", "w0 ")


def test_keepalives_do_not_break_the_sdks_stream(
    alice: Caller, http: TestClient[Any], model_id: str, db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle stream gets `: keepalive` lines; OpenAI's SDK must read past them (a
    comment followed by a blank line would reach it as an empty event and crash it)."""
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.05)
    task_id = create(alice, model_id)

    def work_later() -> None:
        time.sleep(0.4)
        complete_one(db)

    worker = threading.Thread(target=work_later)
    worker.start()
    bodies: list[bytes] = []
    with sdk_over(http, alice.token, bodies).responses.stream(response_id=task_id) as stream:
        final = stream.get_final_response()
    worker.join()
    assert b": keepalive\n" in bodies[-1]
    assert final.output_text == "w0 w1 w2 "
