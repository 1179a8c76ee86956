"""A client over its limits, as the official `openai` SDK meets it against a real
`taskward run`: the 429 tells the SDK how long to wait, and its own retry succeeds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
import openai

from tests.api.served import Service
from tests.openai.conftest import MODEL, SCOPES
from tests.openai.test_sdk import settled


@contextmanager
def _limited_sdk(served: Service, *limits: str) -> Iterator[tuple[openai.OpenAI, list[int]]]:
    """An SDK client for a new client paired with `limits`, and the status of every
    answer its HTTP client received (retries included)."""
    issued = served.cli_json("pair", "--scopes", SCOPES, "--token", *limits)
    assert isinstance(issued, dict)
    statuses: list[int] = []
    http = httpx2.Client(event_hooks={"response": [lambda answer: statuses.append(
        answer.status_code)]})
    with openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=str(issued["token"]),
                       timeout=30, http_client=http) as sdk:
        yield sdk, statuses


def test_the_sdk_retries_a_rate_limited_create_and_it_succeeds(served: Service) -> None:
    with _limited_sdk(served, "--requests-per-second", "1") as (sdk, statuses):
        first = sdk.responses.create(model=MODEL, input="words=1", background=True)
        second = sdk.responses.create(model=MODEL, input="words=1", background=True)
        assert second.id != first.id
        assert settled(sdk, second.id).status == "completed"
    assert statuses[:3] == [202, 429, 202], statuses


def test_the_sdk_retries_past_a_full_quota_once_a_task_finishes(served: Service) -> None:
    with _limited_sdk(served, "--max-active-tasks", "1") as (sdk, statuses):
        busy = sdk.responses.create(model=MODEL, input="words=1 delay=0.5", background=True)
        waiting = sdk.responses.create(model=MODEL, input="words=1", background=True)
        assert settled(sdk, busy.id).status == "completed"
        assert settled(sdk, waiting.id).status == "completed"
    assert statuses[0] == 202 and 429 in statuses[1:3], statuses
