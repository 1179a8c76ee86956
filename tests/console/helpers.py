"""A browser-like client of the console over the ASGI test client, and store builders
that give its pages something to show (real tasks moved by the real store functions)."""

from __future__ import annotations

import re
from typing import Any

import httpx
from litestar.testing import TestClient

from core.objects import item_id
from core.store import claims, worker_writes
from core.store.database import Database
from core.store.transitions import Event
from tests.store.helpers import new_task

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


class Console:
    """A TestClient that logs in through the form and keeps the session cookie."""

    def __init__(self, http: TestClient[Any]) -> None:
        self.http = http

    def login(self, token: str) -> httpx.Response:
        return self.http.post("/console/login", data={"token": token}, follow_redirects=False)

    def page(self, path: str) -> str:
        answer = self.http.get(path, follow_redirects=False)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
        assert answer.headers["content-type"].startswith("text/html")
        return answer.text

    def csrf(self) -> str:
        found = CSRF.search(self.page("/console"))
        assert found, "no CSRF token on the overview"
        return found.group(1)

    def act(self, path: str, csrf: str | None = None) -> httpx.Response:
        """Post one of the console's forms, as its button would."""
        token = self.csrf() if csrf is None else csrf
        return self.http.post(path, data={"csrf": token}, follow_redirects=False)


def dead_letter(db: Database, model: str) -> str:
    """A task whose only attempt failed retryably: the claim dead-letters it."""
    task_id = new_task(db, model, max_attempts=1)
    [claim] = claims.claim(db, limit=1, lease_ms=60_000, node_id="console-tests")
    assert not worker_writes.requeue(db, claim.task_id, claim.owner_token, delay_ms=0,
                                     code="engine_error", message="injected")
    return task_id


def running(db: Database, model: str, *, words: int = 0) -> str:
    """A task a worker is running, with `words` deltas written so far."""
    task_id = new_task(db, model)
    [claim] = claims.claim(db, limit=1, lease_ms=60_000, node_id="console-tests")
    worker_writes.start_running(db, claim.task_id, claim.owner_token)
    if words:
        deltas = [Event("response.output_text.delta",
                        {"item_id": item_id(task_id), "output_index": 0, "content_index": 0,
                         "delta": f"w{n} "}) for n in range(words)]
        worker_writes.append_output(db, task_id, claim.owner_token, deltas,
                                    text="".join(f"w{n} " for n in range(words)))
    return task_id
