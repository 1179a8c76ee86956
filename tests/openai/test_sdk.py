"""The official `openai` SDK, unchanged, against a real `taskward run` (docs/http-api.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.responses import Response, ResponseTextDeltaEvent

from tests.api.served import Service
from tests.engines import expected_text
from tests.openai.conftest import MODEL

TERMINAL = {"completed", "failed", "cancelled"}


def create(sdk: openai.OpenAI, words: str = "words=5", **fields: Any) -> Response:
    """`responses.create(background=True)`; taskward-only fields go in `extra_body`."""
    extra = {key: fields.pop(key) for key in ("max_attempts", "run_at") if key in fields}
    return sdk.responses.create(model=MODEL, input=words, background=True, extra_body=extra,
                                **fields)


def settled(sdk: openai.OpenAI, response_id: str, seconds: float = 15) -> Response:
    """Poll `retrieve` as an SDK user would, until the response is finished."""
    deadline = time.monotonic() + seconds
    while (response := sdk.responses.retrieve(response_id)).status not in TERMINAL:
        assert time.monotonic() < deadline, f"{response_id} still {response.status}"
        time.sleep(0.05)
    return response


def test_a_background_response_is_queued_then_completes(sdk: openai.OpenAI) -> None:
    created = create(sdk, "words=5")
    assert (created.object, created.status, created.model) == ("response", "queued", MODEL)
    done = settled(sdk, created.id)
    assert (done.id, done.status, done.output_text) == (created.id, "completed", expected_text(5))
    assert done.error is None


def test_usage_comes_from_the_engine_and_metadata_round_trips(sdk: openai.OpenAI) -> None:
    created = create(sdk, "words=4", metadata={"team": "search", "run": "7"})
    done = settled(sdk, created.id)
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (3, 4, 7)
    assert created.metadata == done.metadata == {"team": "search", "run": "7"}


def test_openais_no_op_fields_at_the_values_taskward_shows_are_taken(
    sdk: openai.OpenAI,
) -> None:
    shown = create(sdk, "words=1")
    created = create(sdk, "words=3", store=True, tools=shown.tools,
                     tool_choice=shown.tool_choice,
                     parallel_tool_calls=shown.parallel_tool_calls,
                     text={"format": {"type": "text"}}, truncation="disabled", include=[],
                     user="end-user-7")
    assert (created.tools, created.tool_choice, created.text) == (
        shown.tools, shown.tool_choice, shown.text)
    assert settled(sdk, created.id).output_text == expected_text(3)


def test_a_raw_stream_starting_after_n_gives_exactly_the_later_events(
    sdk: openai.OpenAI,
) -> None:
    done = settled(sdk, create(sdk, "words=5").id)
    everything = [e.sequence_number for e in sdk.responses.retrieve(done.id, stream=True)]
    later = list(sdk.responses.retrieve(done.id, stream=True, starting_after=4))
    assert everything == list(range(1, everything[-1] + 1))
    assert [e.sequence_number for e in later] == everything[4:]
    assert later[-1].type == "response.completed"


def test_the_stream_helper_follows_a_response_from_the_start(sdk: openai.OpenAI) -> None:
    created = create(sdk, "words=8 delay=0.03")
    with sdk.responses.stream(response_id=created.id) as stream:
        deltas = [e.delta for e in stream if isinstance(e, ResponseTextDeltaEvent)]
        final = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == expected_text(8)
    assert (final.id, final.status, final.output_text) == (created.id, "completed",
                                                           expected_text(8))


def test_cancelling_a_delayed_response_cancels_it(sdk: openai.OpenAI) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    created = create(sdk, "words=5", run_at=later)
    assert sdk.responses.cancel(created.id).status == "cancelled"
    assert sdk.responses.retrieve(created.id).status == "cancelled"


def test_cancelling_a_running_response_ends_it_cancelled(sdk: openai.OpenAI) -> None:
    created = create(sdk, "words=400 delay=0.02")
    deadline = time.monotonic() + 10
    while sdk.responses.retrieve(created.id).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sdk.responses.cancel(created.id).status in {"in_progress", "cancelled"}
    assert settled(sdk, created.id).status == "cancelled"


def test_cancelling_a_finished_response_returns_it_unchanged(sdk: openai.OpenAI) -> None:
    done = settled(sdk, create(sdk, "words=3").id)
    assert sdk.responses.cancel(done.id) == done
    assert sdk.responses.retrieve(done.id) == done


def test_deleting_a_finished_response_removes_it(sdk: openai.OpenAI) -> None:
    done = settled(sdk, create(sdk, "words=2").id)
    sdk.responses.delete(done.id)
    with pytest.raises(openai.NotFoundError) as gone:
        sdk.responses.retrieve(done.id)
    assert gone.value.code == "task_not_found"


def test_models_read_as_openais_model_objects(sdk: openai.OpenAI) -> None:
    [listed] = [model for model in sdk.models.list() if model.id == MODEL]
    fetched = sdk.models.with_raw_response.retrieve(MODEL).http_response.json()
    strict = openai.types.Model.model_validate(fetched, strict=True)  # required fields
    assert (strict.id, strict.object, strict.owned_by) == (MODEL, "model", "taskward")
    assert listed.created == strict.created
    assert abs(strict.created - time.time()) < 3600  # registered for this test


def test_an_unknown_model_is_unprocessable_with_our_code(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        sdk.responses.create(model="no-such-model", input="words=1", background=True)
    assert refused.value.code == "model_not_found"
    assert isinstance(refused.value.body, dict) and refused.value.body["field"] == "model"


def test_a_failed_response_streams_to_its_end_and_carries_its_error(
    sdk: openai.OpenAI,
) -> None:
    created = create(sdk, "words=3 fail=fatal fail_at=1")
    with sdk.responses.stream(response_id=created.id) as stream:
        types = [e.type for e in stream]
    assert types[0] == "response.created" and types[-1] == "response.failed"
    failed = sdk.responses.retrieve(created.id)
    assert failed.status == "failed" and failed.error is not None
    assert (failed.error.code, failed.error.message) == ("bad_request", "injected failure")


def test_a_retry_streams_through_without_breaking_the_stream(sdk: openai.OpenAI) -> None:
    """The retry's `response.queued` carries the failed attempt's error; the SDK must not
    take it for a broken stream (it raises on streamed data with a top-level `error`)."""
    created = create(sdk, "words=3 fail=retryable fail_at=0", max_attempts=2)
    with sdk.responses.stream(response_id=created.id) as stream:
        events = list(stream)
    queued = [e for e in events if e.type == "response.queued"]
    assert len(queued) == 1 and queued[0].response.error is not None
    # Our codes are not among the SDK's literal ones, so read it as the data it parsed.
    assert queued[0].response.error.model_dump()["code"] == "engine_error"
    assert events[-1].type == "response.failed"


class _LoseFirstAnswer(httpx2.BaseTransport):
    """Delivers the first request, lets the server answer it, then reports a timeout:
    exactly what a client sees when its own timeout fires after the server committed."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.sent = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent += 1
        answer = self._inner.handle_request(request)
        if self.sent > 1:
            return answer
        answer.read()
        answer.close()
        raise httpx2.ReadTimeout("the answer was lost", request=request)

    def close(self) -> None:
        self._inner.close()


def test_sdk_retries_with_an_idempotency_key_create_one_task(
    served: Service, tokens: Callable[[], str],
) -> None:
    token, lossy = tokens(), _LoseFirstAnswer()
    with openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=token, max_retries=2,
                       http_client=httpx2.Client(transport=lossy)) as sdk:
        answer = sdk.responses.with_raw_response.create(
            model=MODEL, input="words=2", background=True,
            extra_headers={"Idempotency-Key": "order-42"})
    assert lossy.sent == 2  # the SDK retried once, after the lost answer
    assert answer.headers["idempotent-replayed"] == "true"
    tasks = httpx.get(f"{served.base_url}/v1/tasks", timeout=10,
                      headers={"Authorization": f"Bearer {token}"}).json()["data"]
    assert [task["id"] for task in tasks] == [answer.parse().id]
