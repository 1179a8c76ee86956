"""A wait whose client has gone ends at once and gives back its stream slot, over real
HTTP (`taskward serve`, one worker, so every request meets the same per-process
count). A client with `max_streams: 1` gives up on a long wait and asks again: before,
it was refused `too_many_streams` until the abandoned wait's time had run out. The
store plays no part in this, so SQLite alone."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import Settings
from core.store.connect import open_database
from tests.api.helpers import register_test_model
from tests.api.served import Service, running_service
from tests.databases import migrated_store

LATER = (datetime.now(UTC) + timedelta(hours=1)).isoformat()  # no sweeper: it stays queued


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp("abandoned-waits")
    with ExitStack() as stack:
        url = stack.enter_context(migrated_store("sqlite", workdir, sqlite_template))
        db = open_database(Settings(database_url=url))
        register_test_model(db, workdir / "models")
        db.dispose()
        yield stack.enter_context(running_service(
            url, workdir, sweeper=False, workers=1,
            settings={"TASKWARD_SYNC_TIMEOUT_SECONDS": "30"}))


@pytest.fixture
def one_stream(service: Service) -> httpx.Client:
    issued: Any = service.cli_json("pair", "--token", "--max-streams", "1", "--scopes",
                                   "responses:create,tasks:read")
    return httpx.Client(base_url=service.base_url, timeout=30,
                        headers={"Authorization": f"Bearer {issued['token']}"})


def abandon(service: Service, head: str, body: bytes = b"") -> None:
    """Send a request, wait a moment for the server to start waiting, and hang up."""
    port = int(service.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head.encode() + b"\r\n" + body)
        time.sleep(0.5)


def queued_task(client: httpx.Client) -> str:
    created = client.post("/v1/responses", json={"model": "words", "input": "words=3",
                                                  "run_at": LATER})
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


def the_slot_is_free_within(client: httpx.Client, task_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if client.get(f"/v1/tasks/{task_id}", params={"wait": 0.1}).status_code == 200:
            return True
        time.sleep(0.1)
    return False


def test_a_long_poll_its_client_left_gives_its_slot_back_at_once(
    service: Service, one_stream: httpx.Client
) -> None:
    task_id = queued_task(one_stream)
    token = one_stream.headers["Authorization"]
    abandon(service, f"GET /v1/tasks/{task_id}?wait=30 HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: {token}\r\n")
    assert the_slot_is_free_within(one_stream, task_id, 5)


def test_a_foreground_request_its_client_left_gives_its_slot_back_at_once(
    service: Service, one_stream: httpx.Client
) -> None:
    body = json.dumps({"model": "words", "input": "words=3", "background": False,
                       "run_at": LATER}).encode()
    token = one_stream.headers["Authorization"]
    abandon(service, f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n", body)
    assert the_slot_is_free_within(one_stream, queued_task(one_stream), 5)
