"""Real requests through `taskward run` with the real default model, over HTTP.

Nothing here knows what the model says: outputs are compared with each other, with the
event log and with the limits of the request, never with hard-coded text.
"""

from __future__ import annotations

import time

import httpx
import pytest

from core.model_files import DEFAULT_ENGINE, DEFAULT_MODEL_ID, default_model_source, sha256_of
from tests.scheduler.processes import wait_until
from tests.service.conftest import Service
from tests.service.running import (
    STORY,
    assert_log_sound,
    create,
    deltas,
    events,
    finished,
    output_text,
    response,
)

pytestmark = pytest.mark.model

OPENING = ["response.created", "response.loading", "response.in_progress",
           "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done",
           "response.output_item.done", "response.completed"]


def test_run_on_an_empty_directory_registers_the_packaged_default_model(
    service: Service, client: httpx.Client
) -> None:
    assert f"registered the default model {DEFAULT_MODEL_ID}" in service.running.log()
    listed = client.get("/v1/models").json()["data"]
    entry = next(m for m in listed if m["id"] == DEFAULT_MODEL_ID)

    source = default_model_source()
    assert entry["engine"] == DEFAULT_ENGINE
    assert entry["sha256"] == sha256_of(source)
    assert entry["size_bytes"] == source.stat().st_size
    assert sha256_of(service.models_dir / entry["path"]) == entry["sha256"]
    # The model card's sampling, so a request that sets none does not loop (greedy).
    assert entry["metadata"] == {"temperature": "0.2", "top_p": "0.9", "repeat_penalty": "1.1"}


def test_a_request_completes_end_to_end_with_a_sound_event_log(
    service: Service, client: httpx.Client
) -> None:
    created = client.post("/v1/responses", json={
        "model": DEFAULT_MODEL_ID, **STORY, "max_output_tokens": 16})
    assert created.status_code == 202, created.text
    task_id = created.json()["id"]

    task = client.get(created.headers["location"], params={"wait": 60}).json()
    log = events(client, task_id)
    answer = response(client, task_id)

    assert (task["status"], task["attempts"], task["error"]) == ("completed", 1, None)
    assert_log_sound(log, task["last_seq"])
    types = [e["type"] for e in log]
    assert types[:len(OPENING)] == OPENING
    assert types[-len(CLOSING):] == CLOSING
    middle = types[len(OPENING):-len(CLOSING)]
    assert middle and set(middle) == {"response.output_text.delta"}
    text = output_text(answer)
    assert text.strip()
    assert text == deltas(log) == log[-4]["data"]["text"]
    assert answer["status"] == "completed"
    usage = answer["usage"]
    assert usage["input_tokens"] > 0
    assert 0 < usage["output_tokens"] <= 16
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_the_same_greedy_request_twice_gives_the_same_text(client: httpx.Client) -> None:
    first, second = (create(client, **STORY, max_output_tokens=32)["id"] for _ in range(2))

    texts = []
    for task_id in (first, second):
        assert finished(client, task_id)["status"] == "completed"
        texts.append(output_text(response(client, task_id)))

    assert texts[0].strip()
    assert texts[0] == texts[1]


def test_cancelling_a_running_task_ends_it_promptly_with_nothing_written_after(
    client: httpx.Client,
) -> None:
    task_id = create(client, **STORY, max_output_tokens=2048)["id"]
    wait_until(lambda: deltas(events(client, task_id)), timeout=60, what="the first delta")

    asked = time.monotonic()
    cancelled = client.post(f"/v1/tasks/{task_id}/cancel")
    assert (cancelled.status_code, cancelled.json()["status"]) == (202, "cancelling")
    task = finished(client, task_id, seconds=30)
    took = time.monotonic() - asked

    assert task["status"] == "cancelled"
    # Normally one flush interval (the next fenced write sees `cancelling`); the bound is
    # loose because the box is shared, yet well under the 10 s heartbeat that would be
    # the only other way for the worker to learn of the cancel.
    assert took < 5.0, f"cancel took {took:.2f}s"
    log = events(client, task_id)
    assert_log_sound(log, task["last_seq"])
    types = [e["type"] for e in log]
    assert types[-2:] == ["response.cancelling", "response.cancelled"]
    assert response(client, task_id)["usage"]["output_tokens"] < 2048
