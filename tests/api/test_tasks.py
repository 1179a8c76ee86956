"""Tasks: pages, isolation, long-poll, cancellation (docs/http-api.md), dead letters and retry."""

from __future__ import annotations

import threading
import time
from typing import Any

from core.store import claims, worker_writes
from core.store.database import Database
from tests.api.helpers import Caller, caller, complete_due, finish, start_due


def create(who: Caller, model_id: str, **fields: Any) -> str:
    answer = who.post("/v1/responses", json={"model": model_id, "input": "words=3", **fields})
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def test_tasks_come_in_cursor_pages_newest_first(alice: Caller, model_id: str) -> None:
    ids = [create(alice, model_id) for _ in range(5)]
    first = alice.get("/v1/tasks", params={"limit": 3}).json()
    assert [t["id"] for t in first["data"]] == ids[::-1][:3]
    second = alice.get("/v1/tasks", params={"limit": 3, "after": first["next_cursor"]}).json()
    assert [t["id"] for t in second["data"]] == ids[::-1][3:]
    assert second["next_cursor"] is None


def test_tasks_filter_by_status(alice: Caller, model_id: str, db: Database) -> None:
    done = create(alice, model_id)
    complete_due(db)
    waiting = create(alice, model_id)
    assert [t["id"] for t in alice.get("/v1/tasks?status=completed").json()["data"]] == [done]
    assert [t["id"] for t in alice.get("/v1/tasks?status=queued").json()["data"]] == [waiting]


def test_a_client_sees_only_its_own_tasks(
    alice: Caller, bob: Caller, admin: Caller, model_id: str
) -> None:
    task_id = create(alice, model_id)
    assert bob.get("/v1/tasks").json()["data"] == []
    for path in ("", "/events"):
        assert bob.get(f"/v1/tasks/{task_id}{path}").status_code == 404
    assert bob.post(f"/v1/tasks/{task_id}/cancel").status_code == 404
    assert admin.get(f"/v1/tasks/{task_id}").json()["client_id"] == alice.id
    assert [t["id"] for t in admin.get("/v1/tasks").json()["data"]] == [task_id]


def test_the_task_object_links_its_resources(alice: Caller, model_id: str) -> None:
    task = alice.get(f"/v1/tasks/{create(alice, model_id)}").json()
    assert task["links"] == {"self": f"/v1/tasks/{task['id']}",
                             "events": f"/v1/tasks/{task['id']}/events",
                             "cancel": f"/v1/tasks/{task['id']}/cancel",
                             "response": f"/v1/responses/{task['id']}"}


def test_wait_returns_as_soon_as_the_task_finishes(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    worker = threading.Timer(0.3, complete_due, args=(db,))
    worker.start()
    began = time.monotonic()
    task = alice.get(f"/v1/tasks/{task_id}", params={"wait": 10}).json()
    worker.join()
    assert task["status"] == "completed"
    assert time.monotonic() - began < 5


def test_wait_gives_up_after_the_given_seconds(alice: Caller, model_id: str) -> None:
    task_id = create(alice, model_id)
    began = time.monotonic()
    task = alice.get(f"/v1/tasks/{task_id}", params={"wait": 0.4}).json()
    assert task["status"] == "queued"
    assert 0.35 < time.monotonic() - began < 5


def test_wait_is_bounded_to_60_seconds(alice: Caller, model_id: str) -> None:
    assert alice.get(f"/v1/tasks/{create(alice, model_id)}?wait=61").status_code == 422


def test_cancelling_a_queued_task_is_immediate(alice: Caller, model_id: str) -> None:
    task_id = create(alice, model_id)
    answer = alice.post(f"/v1/tasks/{task_id}/cancel")
    assert (answer.status_code, answer.json()["status"]) == (200, "cancelled")


def test_cancelling_a_running_task_asks_its_worker(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    start_due(db)
    answer = alice.post(f"/v1/tasks/{task_id}/cancel")
    assert (answer.status_code, answer.json()["status"]) == (202, "cancelling")
    again = alice.post(f"/v1/tasks/{task_id}/cancel")
    assert (again.status_code, again.json()["status"]) == (202, "cancelling")


def test_cancelling_a_finished_task_is_409_with_the_task(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id)
    complete_due(db)
    answer = alice.post(f"/v1/tasks/{task_id}/cancel")
    body = answer.json()
    assert (answer.status_code, body["code"]) == (409, "task_already_finished")
    assert (body["task"]["id"], body["task"]["status"]) == (task_id, "completed")
    assert answer.headers["x-should-retry"] == "false"


def test_cancelling_needs_tasks_cancel(db: Database, http: Any, alice: Caller,
                                       model_id: str) -> None:
    reader = caller(db, http, "tasks:read")
    assert reader.post(f"/v1/tasks/{create(alice, model_id)}/cancel").status_code == 403


def dead_letter(db: Database, who: Caller, model_id: str) -> str:
    task_id = create(who, model_id, max_attempts=1)
    (claim,) = claims.claim(db, limit=1, lease_ms=60_000, node_id="test")
    assert not worker_writes.requeue(db, claim.task_id, claim.owner_token, delay_ms=0,
                                     code="engine_error", message="boom")
    return task_id


def test_dead_letters_are_listed_for_admins(
    admin: Caller, alice: Caller, model_id: str, db: Database
) -> None:
    task_id = dead_letter(db, alice, model_id)
    create(alice, model_id)
    listed = admin.get("/v1/dead-letters").json()["data"]
    assert [(t["id"], t["dead_lettered"]) for t in listed] == [(task_id, True)]
    assert alice.get("/v1/dead-letters").status_code == 403


def test_retry_makes_a_new_task_from_a_failed_one(
    admin: Caller, alice: Caller, model_id: str, db: Database
) -> None:
    failed = dead_letter(db, alice, model_id)
    answer = admin.post(f"/v1/tasks/{failed}/retry")
    assert answer.status_code == 202
    fresh = answer.json()
    assert fresh["id"] != failed and fresh["status"] == "queued"
    assert answer.headers["location"] == f"/v1/tasks/{fresh['id']}"
    assert admin.get(f"/v1/tasks/{failed}").json()["status"] == "failed"
    (claim,) = start_due(db)
    finish(db, claim)
    assert alice.get(f"/v1/tasks/{fresh['id']}").json()["status"] == "completed"


def test_only_failed_tasks_can_be_retried(admin: Caller, alice: Caller, model_id: str) -> None:
    answer = admin.post(f"/v1/tasks/{create(alice, model_id)}/retry")
    assert (answer.status_code, answer.json()["code"]) == (409, "task_not_failed")
