"""Creating work and idempotency keys (docs/http-api.md)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import TestClient

from core.settings import Settings
from core.store.database import Database
from infra.app import serving_app
from tests.api.helpers import Caller, caller, complete_due, complete_soon


def create(who: Caller, model_id: str, **fields: Any) -> Any:
    headers = fields.pop("headers", None)
    return who.post("/v1/responses", json={"model": model_id, "input": "words=3", **fields},
                    headers=headers)


def test_create_answers_202_with_location_after_persisting(alice: Caller, model_id: str) -> None:
    answer = create(alice, model_id)
    assert answer.status_code == 202
    body = answer.json()
    assert (body["object"], body["status"], body["model"]) == ("response", "queued", model_id)
    assert answer.headers["location"] == f"/v1/tasks/{body['id']}"
    task = alice.get(answer.headers["location"]).json()
    assert (task["status"], task["last_seq"]) == ("queued", 1)


def test_every_field_is_stored(alice: Caller, model_id: str) -> None:
    run_at = datetime.now(UTC) + timedelta(hours=1)
    body = create(alice, model_id, input=[{"role": "user", "content": "words=2"}],
                  instructions="be brief", max_output_tokens=16, temperature=0.5, top_p=0.9,
                  seed=7, on_restart="resume", max_attempts=5, run_at=run_at.isoformat(),
                  metadata={"team": "a"}, dedupe_key="daily").json()
    task = alice.get(f"/v1/tasks/{body['id']}").json()
    assert (task["on_restart"], task["max_attempts"], task["dedupe_key"]) == ("resume", 5, "daily")
    assert task["metadata"] == {"team": "a"} == body["metadata"]
    assert task["run_at"] > task["created_at"]
    assert (body["temperature"], body["instructions"]) == (0.5, "be brief")


def test_max_attempts_over_the_cap_is_422(alice: Caller, model_id: str, settings: Settings) -> None:
    answer = create(alice, model_id, max_attempts=settings.max_attempts_cap + 1)
    assert (answer.status_code, answer.json()["field"]) == (422, "max_attempts")


def test_more_than_16_metadata_pairs_is_422(alice: Caller, model_id: str) -> None:
    answer = create(alice, model_id, metadata={f"k{i}": "v" for i in range(17)})
    assert answer.status_code == 422


def test_an_unknown_model_is_422_and_stores_nothing(alice: Caller, model_id: str) -> None:
    answer = create(alice, "no-such-model")
    assert (answer.status_code, answer.json()["code"]) == (422, "model_not_found")
    assert alice.get("/v1/tasks").json()["data"] == []


def test_an_idempotent_replay_is_byte_identical(alice: Caller, model_id: str) -> None:
    first = create(alice, model_id, headers={"Idempotency-Key": "order-1"})
    again = create(alice, model_id, headers={"Idempotency-Key": '"order-1"'})  # sf-string
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert len(alice.get("/v1/tasks").json()["data"]) == 1


def test_a_reused_key_with_another_body_is_422(alice: Caller, model_id: str) -> None:
    create(alice, model_id, headers={"Idempotency-Key": "order-2"})
    answer = create(alice, model_id, input="words=9", headers={"Idempotency-Key": "order-2"})
    assert (answer.status_code, answer.json()["code"]) == (422, "idempotency_key_reused")


def test_keys_are_scoped_per_client(alice: Caller, bob: Caller, model_id: str) -> None:
    mine = create(alice, model_id, headers={"Idempotency-Key": "shared"}).json()
    theirs = create(bob, model_id, headers={"Idempotency-Key": "shared"}).json()
    assert mine["id"] != theirs["id"]


def test_a_refused_request_does_not_keep_its_key(alice: Caller, model_id: str) -> None:
    assert create(alice, "no-such-model", headers={"Idempotency-Key": "k"}).status_code == 422
    assert create(alice, model_id, headers={"Idempotency-Key": "k"}).status_code == 202


@pytest.mark.parametrize("key", ["x" * 256, "x" * 5000, "tab\there"])
def test_an_invalid_key_is_refused_with_one_code(alice: Caller, model_id: str, key: str) -> None:
    answer = create(alice, model_id, headers={"Idempotency-Key": key})
    assert (answer.status_code, answer.json()["code"]) == (422, "invalid_idempotency_key")


def test_a_dedupe_hit_answers_the_active_task(
    alice: Caller, model_id: str, db: Database
) -> None:
    first = create(alice, model_id, dedupe_key="nightly").json()
    hit = create(alice, model_id, dedupe_key="nightly")
    assert (hit.status_code, hit.headers["dedupe-hit"], hit.json()["id"]) == (
        200, "true", first["id"])
    complete_due(db)
    fresh = create(alice, model_id, dedupe_key="nightly")
    assert fresh.status_code == 202 and fresh.json()["id"] != first["id"]


def test_background_false_waits_for_the_finished_object(
    alice: Caller, model_id: str, db: Database
) -> None:
    worker = complete_soon(db)
    answer = create(alice, model_id, background=False)
    worker.join()
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "w0 w1 w2 "


def sent_twice(alice: Caller, model_id: str, db: Database, **fields: Any) -> tuple[Any, Any]:
    """The answers to a request and to its replay (same Idempotency-Key), the first one
    finished by a worker meanwhile."""
    worker = complete_soon(db)
    first = create(alice, model_id, headers={"Idempotency-Key": "replayed"}, **fields)
    worker.join()
    return first, create(alice, model_id, headers={"Idempotency-Key": "replayed"}, **fields)


def test_a_replayed_background_false_request_answers_with_the_finished_object_again(
    alice: Caller, model_id: str, db: Database
) -> None:
    first, again = sent_twice(alice, model_id, db, background=False)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json() and again.json()["status"] == "completed"


def test_a_replayed_stream_request_streams_the_same_events_again(
    alice: Caller, model_id: str, db: Database
) -> None:
    first, again = sent_twice(alice, model_id, db, stream=True)
    assert again.headers["content-type"].startswith("text/event-stream")
    assert again.text == first.text
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers


def test_background_false_answers_202_when_the_sync_timeout_passes(
    settings: Settings, db: Database, model_id: str
) -> None:
    impatient = replace(settings, sync_timeout_seconds=0.3)
    with TestClient(serving_app(impatient)) as http:
        answer = create(caller(db, http, "responses:create"), model_id, background=False)
    assert answer.status_code == 202
    assert answer.json()["status"] == "queued"
    assert answer.headers["location"].startswith("/v1/tasks/")


def test_prefer_respond_async_answers_at_once(alice: Caller, model_id: str) -> None:
    answer = create(alice, model_id, background=False,
                    headers={"Prefer": "wait=10, respond-async"})
    assert answer.status_code == 202
    assert answer.headers["preference-applied"] == "respond-async"


def test_prefer_of_any_length_is_read_and_what_it_does_not_know_ignored(
    alice: Caller, model_id: str
) -> None:
    answer = create(alice, model_id, background=False,
                    headers={"Prefer": "x-vendor=" + "a" * 1000 + ", respond-async"})
    assert answer.status_code == 202
    assert answer.headers["preference-applied"] == "respond-async"


def test_stream_true_streams_events_until_the_terminal_one(
    alice: Caller, model_id: str, db: Database
) -> None:
    worker = complete_soon(db)
    answer = create(alice, model_id, background=False, stream=True)
    worker.join()
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    types = [line.split(": ", 1)[1] for line in answer.text.splitlines()
             if line.startswith("event: ")]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.output_text.delta" in types


def test_the_response_object_is_readable_by_its_owner_only(
    alice: Caller, bob: Caller, model_id: str
) -> None:
    created = create(alice, model_id).json()
    assert alice.get(f"/v1/responses/{created['id']}").json() == created
    assert bob.get(f"/v1/responses/{created['id']}").status_code == 404


@pytest.mark.parametrize("scope", ["tasks:read", "models:read"])
def test_creating_needs_responses_create(
    db: Database, http: TestClient[Any], model_id: str, scope: str
) -> None:
    assert create(caller(db, http, scope), model_id).status_code == 403
