"""A replayed create (same Idempotency-Key) whose task is gone, deleted or removed by
retention before its key expired, answers the stored answer whatever its mode, as a
background request's replay does: never a `404` from the create route
(docs/http-api.md)."""

from __future__ import annotations

from typing import Any

import pytest

from core.store.database import Database
from tests.api.helpers import Caller
from tests.api.test_responses import create, sent_twice


@pytest.mark.parametrize("mode", [{"background": True}, {"background": False},
                                  {"stream": True}], ids=["background", "wait", "stream"])
def test_a_replay_after_its_task_was_deleted_answers_the_stored_answer(
    alice: Caller, model_id: str, db: Database, mode: dict[str, Any]
) -> None:
    first, _ = sent_twice(alice, model_id, db, **mode)
    task_id = first.headers.get("location", "").removeprefix("/v1/tasks/") or (
        alice.get("/v1/tasks").json()["data"][0]["id"])
    assert alice.delete(f"/v1/responses/{task_id}").status_code == 200
    again = create(alice, model_id, headers={"Idempotency-Key": "replayed"}, **mode)
    assert again.status_code == 202, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == f"/v1/tasks/{task_id}"
    body = again.json()
    assert (body["id"], body["status"]) == (task_id, "queued")
    assert alice.get("/v1/tasks").json()["data"] == []  # nothing created again
