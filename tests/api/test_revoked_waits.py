"""A wait ends when its client is revoked, as a stream does: within about
`AUTH_RECHECK_SECONDS` it answers the `401 invalid_token` any request of the revoked
token gets, instead of the task when the wait runs out. The revocation is written to
the store directly, as another process would write it: this one learns of it through
its token cache, as its streams do."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from litestar.testing import TestClient

from core.store.clients import revoke
from core.store.database import Database
from tests.api.helpers import Caller, caller

LATER = (datetime.now(UTC) + timedelta(hours=1)).isoformat()  # the task stays queued
REVOKED_AFTER = 1.0


def _revoked_soon(db: Database, who: Caller) -> float:
    """Revoke `who` in `REVOKED_AFTER` seconds; when that was asked."""
    threading.Timer(REVOKED_AFTER, revoke, args=(db, who.id)).start()
    return time.monotonic()


def _assert_ended_by_the_revocation(answer: Any, asked_at: float) -> None:
    assert (answer.status_code, answer.json()["code"]) == (401, "invalid_token"), answer.text
    assert time.monotonic() - asked_at < REVOKED_AFTER + 2.5


def test_a_revoked_clients_long_poll_answers_401_within_about_a_second(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    waiter = caller(db, http, "responses:create", "tasks:read")
    task_id = waiter.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                                 "run_at": LATER}).json()["id"]
    asked_at = _revoked_soon(db, waiter)
    answer = waiter.get(f"/v1/tasks/{task_id}", params={"wait": 30}, timeout=40)
    _assert_ended_by_the_revocation(answer, asked_at)


def test_a_revoked_clients_foreground_create_answers_401_within_about_a_second(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    waiter = caller(db, http, "responses:create", "tasks:read")
    asked_at = _revoked_soon(db, waiter)
    answer = waiter.post("/v1/responses", timeout=70, json={
        "model": model_id, "input": "words=3", "background": False, "run_at": LATER})
    _assert_ended_by_the_revocation(answer, asked_at)


def test_a_wait_of_a_client_still_holding_its_token_runs_its_time(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    waiter = caller(db, http, "responses:create", "tasks:read")
    task_id = waiter.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                                 "run_at": LATER}).json()["id"]
    started = time.monotonic()
    answer = waiter.get(f"/v1/tasks/{task_id}", params={"wait": 2.5})
    assert answer.status_code == 200 and answer.json()["status"] == "queued"
    assert time.monotonic() - started >= 2.5
