"""`POST /v1/schedules` under an Idempotency-Key, as `POST /v1/responses` answers one
(docs/http-api.md#schedules): a retried create must not double every firing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from freezegun import freeze_time
from litestar.testing import TestClient
from sqlalchemy import func, select

from core.idempotency import IdempotencyClaim, request_digest
from core.quotas import Limits
from core.schedules import create_schedule_once
from core.settings import Settings
from core.store.clients import create_client
from core.store.database import Database
from core.store.models import remove
from core.tables import schedules
from tests.schedules.helpers import Caller

PATH = "/v1/schedules"


def body(model: str, text: str = "words=2") -> dict[str, Any]:
    return {"cron": "0 7 * * *", "request": {"model": model, "input": text}}


def create(caller: Caller, payload: dict[str, Any], key: str) -> httpx.Response:
    response: httpx.Response = caller.http.post(PATH, json=payload, headers={
        **caller.headers, "Idempotency-Key": key})
    return response


def stored_schedules(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(schedules)).scalar_one())


def test_the_same_key_and_request_get_the_first_answer_again_byte_for_byte(
    db: Database, alice: Caller, model_id: str
) -> None:
    first = create(alice, body(model_id), "nightly-1")
    again = create(alice, body(model_id), '"nightly-1"')  # the same key, as an sf-string
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert stored_schedules(db) == 1


def test_the_same_key_with_another_request_is_422_idempotency_key_reused(
    db: Database, alice: Caller, model_id: str
) -> None:
    assert create(alice, body(model_id), "nightly-2").status_code == 201
    reused = create(alice, body(model_id, "words=9"), "nightly-2")
    assert (reused.status_code, reused.json()["code"]) == (422, "idempotency_key_reused")
    assert stored_schedules(db) == 1


def test_a_key_used_on_responses_is_another_request_on_schedules(
    db: Database, alice: Caller, model_id: str
) -> None:
    task = alice.http.post("/v1/responses", json={"model": model_id, "input": "words=2"},
                      headers={**alice.headers, "Idempotency-Key": "shared-route"})
    assert task.status_code == 202
    answer = create(alice, body(model_id), "shared-route")
    assert (answer.status_code, answer.json()["code"]) == (422, "idempotency_key_reused")
    assert stored_schedules(db) == 0


def test_a_key_used_on_schedules_is_another_request_on_responses(
    alice: Caller, model_id: str
) -> None:
    assert create(alice, body(model_id), "shared-route").status_code == 201
    task = alice.http.post("/v1/responses", json={"model": model_id, "input": "words=2"},
                      headers={**alice.headers, "Idempotency-Key": "shared-route"})
    assert (task.status_code, task.json()["code"]) == (422, "idempotency_key_reused")


def test_a_malformed_key_is_refused_as_the_responses_route_refuses_it(
    db: Database, alice: Caller, model_id: str
) -> None:
    for key in ("", "x" * 256, "tab\there"):
        schedule = alice.http.post(PATH, json=body(model_id),
                              headers={**alice.headers, "Idempotency-Key": key})
        task = alice.http.post("/v1/responses", json={"model": model_id, "input": "words=2"},
                          headers={**alice.headers, "Idempotency-Key": key})
        assert (schedule.status_code, schedule.json()["code"]) == (
            task.status_code, task.json()["code"]) == (422, "invalid_idempotency_key")
    assert stored_schedules(db) == 0


def test_keys_are_per_client(db: Database, alice: Caller, bob: Caller, model_id: str) -> None:
    mine = create(alice, body(model_id), "same-key").json()
    theirs = create(bob, body(model_id), "same-key").json()
    assert mine["id"] != theirs["id"] and theirs["client_id"] == bob.client_id
    assert stored_schedules(db) == 2


def test_a_refused_create_records_nothing(db: Database, alice: Caller, model_id: str) -> None:
    refused = create(alice, body("no-such-model"), "first-try")
    assert (refused.status_code, refused.json()["code"]) == (422, "model_not_found")
    assert create(alice, body(model_id), "first-try").status_code == 201
    assert stored_schedules(db) == 1


def test_a_retry_is_answered_from_the_record_after_its_model_is_gone(
    db: Database, alice: Caller, model_id: str
) -> None:
    first = create(alice, body(model_id), "before-removal")
    remove(db, model_id)
    again = create(alice, body(model_id), "before-removal")
    assert (again.status_code, again.content) == (201, first.content)


def test_a_replay_passes_an_empty_rate_bucket(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    issued = create_client(db, name="slow", scopes=frozenset({"responses:create"}),
                           limits=Limits(requests_per_second=0.5))
    limited = Caller(http, issued.token, issued.client_id)
    first = create(limited, body(model_id), "again")
    assert create(limited, body(model_id, "words=3"), "other").status_code == 429
    replay = create(limited, body(model_id), "again")
    assert (replay.status_code, replay.content) == (201, first.content)
    assert stored_schedules(db) == 1


def test_eight_concurrent_creates_with_one_key_store_one_schedule(
    db: Database, alice: Caller, model_id: str
) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: create(alice, body(model_id), "burst"), range(8)))
    assert {a.status_code for a in answers} == {201}
    assert len({a.content for a in answers}) == 1
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 7
    assert stored_schedules(db) == 1


def test_racing_creates_in_the_store_make_one_schedule(
    db: Database, settings: Settings, model_id: str
) -> None:
    payload = body(model_id)
    claim = IdempotencyClaim("race", request_digest("POST", PATH, payload))
    with ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda _: create_schedule_once(
            db, settings, "client-a", payload, claim), range(8)))
    assert len({c.schedule_id for c in created}) == 1
    assert sorted(c.replayed for c in created) == [False] + [True] * 7
    assert stored_schedules(db) == 1


def test_an_expired_key_creates_again(db: Database, settings: Settings, model_id: str) -> None:
    payload = body(model_id)
    claim = IdempotencyClaim("daily", request_digest("POST", PATH, payload))
    start = datetime(2024, 3, 1, tzinfo=UTC)
    with freeze_time(start):
        first = create_schedule_once(db, settings, "client-a", payload, claim)
    ttl = timedelta(hours=settings.idempotency_ttl_hours)
    with freeze_time(start + ttl - timedelta(seconds=1)):
        assert create_schedule_once(db, settings, "client-a", payload, claim).replayed
    with freeze_time(start + ttl):
        later = create_schedule_once(db, settings, "client-a", payload, claim)
    assert not later.replayed and later.schedule_id != first.schedule_id
    assert stored_schedules(db) == 2
