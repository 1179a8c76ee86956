"""A stream whose events keep coming still learns of a revocation: its token is asked
about at most once per `AUTH_RECHECK_SECONDS` while pages flow, never left unasked."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from litestar.testing import TestClient

from core.objects import item_id
from core.store import worker_writes
from core.store.clients import revoke
from core.store.database import Database
from core.store.transitions import Event
from tests.api.helpers import caller, start_due
from tests.api.test_hostile_input import create


@pytest.mark.parametrize("path", ["/v1/tasks/{}/events", "/v1/responses/{}?stream=true"])
def test_a_revoked_clients_stream_ends_while_deltas_keep_coming(
    db: Database, http: TestClient[Any], model_id: str, path: str
) -> None:
    watcher = caller(db, http, "responses:create", "tasks:read")
    task_id = create(watcher, model_id).json()["id"]
    [claim] = start_due(db)
    delta = {"item_id": item_id(task_id), "output_index": 0, "content_index": 0, "delta": "w "}
    stop = threading.Event()

    def write_deltas() -> None:  # a page every 50 ms, for at most 15 s
        for _ in range(300):
            if stop.wait(0.05):
                return
            worker_writes.append_output(db, task_id, claim.owner_token,
                                        [Event("response.output_text.delta", delta)], text="w ")

    writer = threading.Thread(target=write_deltas)
    writer.start()
    threading.Timer(1.0, revoke, args=(db, watcher.id)).start()
    started = time.monotonic()
    try:
        answer = watcher.get(path.format(task_id), headers={"Accept": "text/event-stream"},
                             timeout=30)
    finally:
        stop.set()
        writer.join()
    assert answer.status_code == 200
    assert answer.text.count("event: response.output_text.delta") >= 5  # it was flowing
    assert time.monotonic() - started < 6
