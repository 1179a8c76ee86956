"""End to end, on both stores: the HTTP API and the official OpenAI SDK in front of a real
llama-server. The text equals the streamed deltas, the usage is the server's own, a
cancel frees the server's slot within a second, and tasks back to back never fail on a
connection the server has closed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from core.settings import Settings
from core.store.connect import open_database
from tests.api.served import Service, running_service
from tests.databases import migrated_store
from tests.openai.test_sdk import settled
from tests.scheduler.processes import wait_until
from tests.upstream.helpers import COUNTING, MODEL, add_upstream
from tests.upstream.llama import LlamaServer
from tests.upstream.served import quick_settings


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path, llama: LlamaServer,
) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp(f"upstream-{request.param}")
    with ExitStack() as stack:
        url = stack.enter_context(migrated_store(request.param, workdir, sqlite_template))
        db = open_database(Settings(database_url=url))
        add_upstream(db, [llama.base_url], max_concurrency=2)
        db.dispose()
        yield stack.enter_context(running_service(url, workdir, workers=1,
                                                  settings=quick_settings()))


@pytest.fixture(scope="module")
def sdk(service: Service) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=service.admin_token(),
                       timeout=60) as client:
        yield client


def test_text_and_usage_are_the_servers_own(sdk: openai.OpenAI, llama: LlamaServer) -> None:
    created = sdk.responses.create(model=MODEL, input=COUNTING, background=True,
                                   temperature=0, max_output_tokens=16)
    assert created.status == "queued"
    deltas = [event.delta for event in sdk.responses.retrieve(created.id, stream=True)
              if event.type == "response.output_text.delta"]
    done = settled(sdk, created.id)

    direct = httpx.post(f"{llama.base_url}/chat/completions", timeout=60, json={
        "model": "smollm2", "messages": [{"role": "user", "content": COUNTING}],
        "temperature": 0, "max_tokens": 16}).json()
    assert done.status == "completed" and done.output_text == "".join(deltas)
    assert done.output_text == direct["choices"][0]["message"]["content"]
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (
        direct["usage"]["prompt_tokens"], direct["usage"]["completion_tokens"])


def test_a_cancel_frees_the_servers_slot_within_a_second(
    sdk: openai.OpenAI, llama: LlamaServer
) -> None:
    created = sdk.responses.create(model=MODEL, input="Tell a very long story about a ship.",
                                   background=True, temperature=0, max_output_tokens=800)
    wait_until(lambda: sdk.responses.retrieve(created.id).status == "in_progress"
               and llama.busy_slots() == 1, timeout=30, what="generation on the server")
    time.sleep(0.3)  # mid-generation

    sdk.responses.cancel(created.id)
    cancelled_at = time.monotonic()
    wait_until(lambda: llama.busy_slots() == 0, timeout=5, what="the slot to go idle")
    assert time.monotonic() - cancelled_at <= 1.0
    assert settled(sdk, created.id).status == "cancelled"


def test_a_sweeper_logs_no_line_per_upstream_request(
    sdk: openai.OpenAI, service: Service
) -> None:
    """httpx logs every request it sends at INFO; a worker process keeps that logger at
    WARNING (docs/operations.md) while its own INFO lines still come out."""
    created = sdk.responses.create(model=MODEL, input=COUNTING, background=True,
                                   temperature=0, max_output_tokens=4)
    assert settled(sdk, created.id).status == "completed"
    log = (Path(service.env["TASKWARD_MODELS_DIR"]).parent / "sweeper.log").read_text()
    assert " INFO " in log
    assert "HTTP Request:" not in log


def test_tasks_back_to_back_each_complete_on_their_first_attempt(
    sdk: openai.OpenAI, service: Service
) -> None:
    """llama-server closes every connection after its answer, while the process's client
    keeps connections for the next request: a request must never go out on one that
    the server has just closed (a failed attempt, the URL cooled down)."""
    created = [sdk.responses.create(model=MODEL, input=COUNTING, background=True,
                                    temperature=0, max_output_tokens=2) for _ in range(16)]
    assert {settled(sdk, c.id, seconds=60).status for c in created} == {"completed"}
    admin = {"Authorization": f"Bearer {sdk.api_key}"}
    for response in created:
        task = httpx.get(f"{service.base_url}/v1/tasks/{response.id}", headers=admin,
                         timeout=10).json()
        assert (task["attempts"], task["error"]) == (1, None)
