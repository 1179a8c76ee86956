"""Per-client limits over HTTP, on both stores: refused at exactly the limit with the
headers OpenAI's SDKs read, nothing stored, replays and dedupe hits still answered."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from litestar.testing import TestClient
from sqlalchemy import func, select, update

from core.clients import Client
from core.quotas import Limits
from core.store.clients import create_client
from core.store.database import Database
from core.tables import idempotency_keys, tasks
from infra.app import serving_app
from tests.api.helpers import Caller, caller, complete_due, complete_soon

WORK = ("responses:create", "tasks:read", "tasks:cancel", "models:read")


def _limited(db: Database, http: TestClient[Any], *more_scopes: str, **limits: Any) -> Caller:
    issued = create_client(db, name="limited", scopes=frozenset({*WORK, *more_scopes}),
                           limits=Limits(**limits))
    return Caller(http, issued.token, issued.client_id)


def _create(who: Caller, model: str, headers: dict[str, str] | None = None,
            **body: Any) -> Any:
    return who.post("/v1/responses", json={"model": model, "input": "words=1", **body},
                    headers=headers)


def _stored(db: Database, client_id: str) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(tasks)
                                .where(tasks.c.client_id == client_id)).scalar_one())


def _assert_limit_headers(answer: Any, limit: str) -> None:
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["x-ratelimit-limit-requests"] == limit
    assert answer.headers["x-ratelimit-remaining-requests"] == "0"
    assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
    assert "x-should-retry" not in answer.headers  # the SDKs retry a 429 by themselves


def test_max_active_tasks_refuses_at_exactly_the_limit_and_stores_nothing(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, max_active_tasks=3)
    assert [_create(limited, model_id).status_code for _ in range(3)] == [202] * 3
    refused = _create(limited, model_id)
    _assert_limit_headers(refused, "3")
    assert refused.json()["code"] == "quota_exceeded"
    assert _stored(db, limited.id) == 3


def test_a_finished_task_frees_its_place_for_the_next_request(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, max_active_tasks=1)
    assert _create(limited, model_id).status_code == 202
    assert _create(limited, model_id).status_code == 429
    complete_due(db)
    assert _create(limited, model_id).status_code == 202


def test_a_replay_and_a_dedupe_hit_pass_a_full_quota(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, max_active_tasks=2)
    first = _create(limited, model_id, {"Idempotency-Key": "k1"})
    held = _create(limited, model_id, dedupe_key="nightly")
    assert (first.status_code, held.status_code) == (202, 202)
    replay = _create(limited, model_id, {"Idempotency-Key": "k1"})
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first.content
    hit = _create(limited, model_id, dedupe_key="nightly")
    assert hit.status_code == 200 and hit.headers["dedupe-hit"] == "true"
    assert _create(limited, model_id, {"Idempotency-Key": "k2"}).status_code == 429
    assert _stored(db, limited.id) == 2


def test_the_request_rate_is_refused_beyond_the_bucket_with_the_headers(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, requests_per_second=1)
    assert limited.get("/v1/tasks").status_code == 200
    refused = limited.get("/v1/tasks")
    _assert_limit_headers(refused, "1")
    assert refused.json()["code"] == "rate_limited"
    assert float(refused.headers["retry-after-ms"]) <= 1000


def test_a_rate_too_small_to_refill_names_a_wait_of_a_day_at_most(
    db: Database, http: TestClient[Any]
) -> None:
    """The API admits any rate from 0 up: at 5e-324 a second (the smallest float) the
    bucket's wait overflowed to infinity (a 500), and at 1e-300 it was 300 digits."""
    for rate in (5e-324, 1e-300):
        limited = _limited(db, http, requests_per_second=rate)
        assert limited.get("/v1/tasks").status_code == 200
        refused = limited.get("/v1/tasks")
        limit = refused.headers["x-ratelimit-limit-requests"]
        _assert_limit_headers(refused, limit)
        assert float(limit) == rate and "e" not in limit  # in full, no exponent
        assert refused.headers["retry-after"] == "86400"
        assert refused.headers["retry-after-ms"] == "86400000"
        assert refused.headers["x-ratelimit-reset-requests"] == "24h0m0s"


def test_a_replay_passes_an_empty_rate_bucket(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, requests_per_second=0.5)
    first = _create(limited, model_id, {"Idempotency-Key": "again"})
    assert first.status_code == 202
    assert _create(limited, model_id).status_code == 429  # nothing stored
    replay = _create(limited, model_id, {"Idempotency-Key": "again"})
    assert replay.status_code == 202 and replay.content == first.content
    assert _stored(db, limited.id) == 1


KEYED = {"Idempotency-Key": "K"}
STILL = 0.01  # requests per second: a bucket spent stays empty for the rest of a test


def test_a_recorded_key_lets_no_other_route_past_an_empty_rate_bucket(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, "clients:admin", requests_per_second=STILL)
    created = _create(limited, model_id, KEYED)
    assert created.status_code == 202
    task_id = created.json()["id"]
    refused = [
        limited.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]}, headers=KEYED),
        limited.post("/v1/schedules", headers=KEYED, json={
            "cron": "0 0 1 1 *", "request": {"model": model_id, "input": "words=1"}}),
        limited.post(f"/v1/tasks/{task_id}/cancel", headers=KEYED),
        limited.post(f"/v1/responses/{task_id}/cancel", headers=KEYED),
    ]
    assert [(answer.status_code, answer.json()["code"]) for answer in refused] == [
        (429, "rate_limited")] * 4
    assert _stored(db, limited.id) == 1


def test_a_recorded_key_with_another_request_does_not_pass_an_empty_rate_bucket(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, requests_per_second=STILL)
    assert _create(limited, model_id, KEYED).status_code == 202
    other = _create(limited, model_id, KEYED, input="words=2")
    assert (other.status_code, other.json()["code"]) == (429, "rate_limited")


def test_an_expired_record_does_not_pass_an_empty_rate_bucket(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    """`enqueue` makes a new task for a request whose record has expired: not a replay."""
    limited = _limited(db, http, requests_per_second=STILL)
    assert _create(limited, model_id, KEYED).status_code == 202
    with db.write() as conn:
        conn.execute(update(idempotency_keys).values(expires_at=0))
    assert _create(limited, model_id, KEYED).status_code == 429
    assert _stored(db, limited.id) == 1


def test_streams_beyond_max_streams_are_refused_and_a_stream_refused_stores_nothing(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, max_streams=1)
    task_id = _create(limited, model_id).json()["id"]
    complete_due(db)
    for _ in range(2):  # a finished stream gives its slot back
        stream = limited.get(f"/v1/tasks/{task_id}/events",
                             headers={"Accept": "text/event-stream"})
        assert stream.status_code == 200 and "response.completed" in stream.text
    holder = Client(limited.id, "limited", frozenset(WORK), Limits(max_streams=1))
    end = http.app.state.services.limits.hold_stream(holder)  # one stream open elsewhere
    try:
        refused = limited.get(f"/v1/tasks/{task_id}/events",
                              headers={"Accept": "text/event-stream"})
        _assert_limit_headers(refused, "1")
        assert refused.json()["code"] == "too_many_streams"
        assert limited.get(f"/v1/tasks/{task_id}?wait=1").status_code == 429
        assert _create(limited, model_id, stream=True).status_code == 429
        assert _create(limited, model_id, background=False).status_code == 429
        assert _stored(db, limited.id) == 1
    finally:
        end()
    assert limited.get(f"/v1/tasks/{task_id}?wait=1").status_code == 200


def test_a_streamed_replay_and_a_dedupe_hit_pass_when_every_stream_slot_is_held(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    limited = _limited(db, http, max_streams=1)
    worker = complete_soon(db)
    first = _create(limited, model_id, {"Idempotency-Key": "streamed"}, stream=True)
    worker.join()
    assert first.status_code == 200 and "response.completed" in first.text
    assert _create(limited, model_id, dedupe_key="one").status_code == 202
    holder = Client(limited.id, "limited", frozenset(WORK), Limits(max_streams=1))
    end = http.app.state.services.limits.hold_stream(holder)  # the one slot is taken
    try:
        assert _create(limited, model_id, stream=True).status_code == 429
        replay = _create(limited, model_id, {"Idempotency-Key": "streamed"}, stream=True)
        assert replay.status_code == 200 and replay.text == first.text
        # The key alone is no replay: only the same request is answered from its record.
        other = _create(limited, model_id, {"Idempotency-Key": "streamed"}, stream=True,
                        input="another request")
        assert other.status_code == 429 and other.json()["code"] == "too_many_streams"
        hit = _create(limited, model_id, stream=True, dedupe_key="one")
        assert hit.status_code == 200 and hit.headers["dedupe-hit"] == "true"
        assert _create(limited, model_id, stream=True, dedupe_key="two").status_code == 429
        assert _stored(db, limited.id) == 2
    finally:
        end()


def test_limits_are_set_by_patch_and_shown_on_the_client(
    db: Database, http: TestClient[Any], admin: Caller, alice: Caller, model_id: str
) -> None:
    changed = admin.patch(f"/v1/clients/{alice.id}", json={"max_active_tasks": 1})
    assert changed.status_code == 200
    assert changed.json()["max_active_tasks"] == 1 and changed.json()["max_streams"] is None
    assert _create(alice, model_id).status_code == 202
    assert _create(alice, model_id).status_code == 429
    assert admin.patch(f"/v1/clients/{alice.id}",
                       json={"max_active_tasks": None}).json()["max_active_tasks"] is None
    assert _create(alice, model_id).status_code == 202
    assert admin.patch(f"/v1/clients/{alice.id}", json={"max_streams": 0}).status_code == 422
    assert admin.patch("/v1/clients/cli_nobody", json={"max_streams": 2}).status_code == 404
    assert alice.patch(f"/v1/clients/{alice.id}", json={"max_streams": 2}).status_code == 403


def test_a_negative_zero_rate_is_stored_and_shown_as_zero(admin: Caller, alice: Caller) -> None:
    """`-0.0` passes `ge=0`; it was stored and shown as `-0.0` (raw JSON: the sign)."""
    changed = admin.patch(f"/v1/clients/{alice.id}", json={"requests_per_second": -0.0})
    assert changed.status_code == 200 and '"requests_per_second":0.0' in changed.text
    [shown] = [c for c in admin.get("/v1/clients").json()["data"] if c["id"] == alice.id]
    assert math.copysign(1, shown["requests_per_second"]) == 1


def test_a_pairing_code_carries_limits_to_the_client_it_makes(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    code = admin.post("/v1/pairing-codes", json={"max_active_tasks": 7,
                                                 "requests_per_second": 2.5}).json()["code"]
    paired = http.post("/v1/pair", json={"code": code}).json()
    [shown] = [c for c in admin.get("/v1/clients").json()["data"]
               if c["id"] == paired["client_id"]]
    assert (shown["max_active_tasks"], shown["requests_per_second"]) == (7, 2.5)


def test_the_settings_give_the_defaults(db: Database, settings: Any, model_id: str) -> None:
    limited = replace(settings, client_max_active_tasks=1)
    with TestClient(serving_app(limited)) as http:
        who = caller(db, http, *WORK)
        assert [_create(who, model_id).status_code for _ in range(2)] == [202, 429]


def test_only_an_admin_may_limit_an_admin_client(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    manager = caller(db, http, "clients:admin")
    refused = manager.patch(f"/v1/clients/{admin.id}", json={"requests_per_second": 0.1})
    assert refused.status_code == 403 and refused.json()["code"] == "admin_required"
    assert admin.patch(f"/v1/clients/{manager.id}", json={"max_streams": 3}).status_code == 200
