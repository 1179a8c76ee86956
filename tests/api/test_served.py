"""End to end over real HTTP: `taskward serve` (two granian workers) and a sweeper, as
processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tests.api.served import Service
from tests.engines import expected_text

USER = "responses:create,tasks:read,tasks:cancel,models:read"
TIMEOUT = httpx.Timeout(30)


def token_client(service: Service, scopes: str = USER) -> tuple[httpx.Client, str]:
    issued: Any = service.cli_json("pair", "--token", "--scopes", scopes)
    client = httpx.Client(base_url=service.base_url, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {issued['token']}"})
    return client, issued["client_id"]


def create(client: httpx.Client, text: str = "words=3", *,
           headers: dict[str, str] | None = None, **fields: Any) -> httpx.Response:
    return client.post("/v1/responses", json={"model": "words", "input": text, **fields},
                       headers=headers)


def task_status(client: httpx.Client, task_id: str) -> str:
    return str(client.get(f"/v1/tasks/{task_id}").json()["status"])


def sse_blocks(lines: Any, limit: int | None = None) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    block: dict[str, str] = {}
    for line in lines:
        if line == "":
            if block:
                blocks.append(block)
                if limit is not None and len(blocks) == limit:
                    break
            block = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            block[key] = value
    return blocks


def test_pair_create_wait_and_read_the_result(service: Service) -> None:
    code: Any = service.cli_json("pair", "--scopes", USER, "--name", "e2e")
    with httpx.Client(base_url=service.base_url, timeout=TIMEOUT) as anonymous:
        issued = anonymous.post("/v1/pair", json={"code": code["code"]}).json()
    client = httpx.Client(base_url=service.base_url, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {issued['token']}"})
    with client:
        created = create(client, "words=4")
        assert created.status_code == 202
        task_id = created.json()["id"]
        task = client.get(created.headers["location"], params={"wait": 30}).json()
        assert task["status"] == "completed"
        events = client.get(f"/v1/tasks/{task_id}/events").json()
        assert [e["seq"] for e in events["data"]] == list(range(1, task["last_seq"] + 1))
        assert events["data"][-1]["type"] == "response.completed"
        response = client.get(f"/v1/responses/{task_id}").json()
        assert response["output"][0]["content"][0]["text"] == expected_text(4)


def test_sse_resumes_from_the_middle_without_gaps_or_repeats(service: Service) -> None:
    client, _ = token_client(service)
    with client:
        task_id = create(client, "words=8 delay=0.05").json()["id"]
        url = f"/v1/tasks/{task_id}/events"
        with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as stream:
            head = sse_blocks(stream.iter_lines(), limit=3)
        last = head[-1]["id"]
        with client.stream("GET", url, headers={"Accept": "text/event-stream",
                                                "Last-Event-ID": last}) as stream:
            tail = sse_blocks(stream.iter_lines())
        seen = [int(b["id"]) for b in head + tail]
        assert seen == list(range(1, len(seen) + 1))
        assert tail[-1]["event"] == "response.completed"
        deltas = "".join(json.loads(b["data"])["delta"] for b in head + tail
                         if b["event"] == "response.output_text.delta")
        assert deltas == expected_text(8)


def test_idempotent_replay_and_reuse(service: Service) -> None:
    client, _ = token_client(service)
    with client:
        first = create(client, headers={"Idempotency-Key": "e2e-1"})
        replay = create(client, headers={"Idempotency-Key": "e2e-1"})
        assert replay.content == first.content
        assert replay.headers["idempotent-replayed"] == "true"
        reused = create(client, "words=5", headers={"Idempotency-Key": "e2e-1"})
        assert (reused.status_code, reused.json()["code"]) == (422, "idempotency_key_reused")


def test_sixteen_concurrent_requests_with_one_key_create_one_task(service: Service) -> None:
    client, _ = token_client(service)
    with client, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(
            lambda _: create(client, headers={"Idempotency-Key": "burst"}), range(16)))
        assert {a.status_code for a in answers} == {202}
        assert len({a.json()["id"] for a in answers}) == 1
        assert len({a.content for a in answers}) == 1
        assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 15


def test_cancel_queued_running_and_finished_tasks(service: Service) -> None:
    client, _ = token_client(service)
    with client:
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        queued = create(client, run_at=later).json()["id"]
        cancelled = client.post(f"/v1/tasks/{queued}/cancel")
        assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")

        running = create(client, "words=400 delay=0.05").json()["id"]
        deadline = time.monotonic() + 20
        while client.get(f"/v1/tasks/{running}").json()["status"] != "running":
            assert time.monotonic() < deadline, "the sweeper did not start the task"
            time.sleep(0.05)
        asked = client.post(f"/v1/tasks/{running}/cancel")
        assert (asked.status_code, asked.json()["status"]) == (202, "cancelling")
        final = client.get(f"/v1/tasks/{running}", params={"wait": 30}).json()
        assert final["status"] == "cancelled"

        refused = client.post(f"/v1/tasks/{running}/cancel")
        assert (refused.status_code, refused.json()["code"]) == (409, "task_already_finished")


def test_clients_are_isolated(service: Service) -> None:
    alice, _ = token_client(service)
    bob, _ = token_client(service)
    with alice, bob:
        task_id = create(alice).json()["id"]
        for path in (f"/v1/tasks/{task_id}", f"/v1/responses/{task_id}",
                     f"/v1/tasks/{task_id}/events"):
            assert bob.get(path).status_code == 404
        assert task_id not in {t["id"] for t in bob.get("/v1/tasks").json()["data"]}


def test_a_revoked_token_is_refused_by_every_worker(service: Service) -> None:
    client, client_id = token_client(service)
    with client:
        for _ in range(8):  # reach, and warm the token caches of, both workers
            assert client.get("/v1/tasks").status_code == 200
        service.cli("clients", "revoke", client_id)
        time.sleep(0.5)  # > poll_interval_ms: every worker has re-read the revocations
        assert {client.get("/v1/tasks").status_code for _ in range(8)} == {401}
