"""`new_task`: the task a validated `POST /v1/responses` body asks for."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core.errors import InvalidInput
from core.requests import ResponseRequest, new_task
from core.settings import Settings
from core.states import OnRestart

SETTINGS = Settings(database_url="sqlite:///unused.db", max_attempts_default=3,
                    max_attempts_cap=5)


def body(**fields: object) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "m", "input": "hi", **fields})


def test_every_field_reaches_the_task() -> None:
    request = body(on_restart="resume", max_attempts=4, metadata={"k": "v"}, dedupe_key="d",
                   run_at="2024-03-01T00:00:00.001+01:00")
    task = new_task(request, client_id="c", settings=SETTINGS, schedule_id="sched_1")
    assert (task.client_id, task.model, task.on_restart, task.max_attempts) == (
        "c", "m", OnRestart.RESUME, 4)
    assert (task.metadata, task.dedupe_key, task.schedule_id) == ({"k": "v"}, "d", "sched_1")
    assert task.run_at == 1_709_247_600_001  # 2024-02-29T23:00:00.001Z, exactly
    stored = json.loads(task.request_json)
    assert isinstance(stored.pop("seed"), int) and "run_at" not in stored
    assert stored == json.loads(request.stored_json())


def test_a_request_without_a_seed_is_stored_with_the_one_drawn_for_it() -> None:
    seeds = {json.loads(new_task(body(), client_id="c", settings=SETTINGS).request_json)["seed"]
             for _ in range(3)}
    given = json.loads(new_task(body(seed=42), client_id="c", settings=SETTINGS).request_json)

    assert len(seeds) == 3 and given["seed"] == 42


def test_max_attempts_defaults_and_is_refused_or_clamped_above_the_cap() -> None:
    assert new_task(body(), client_id="c", settings=SETTINGS).max_attempts == 3
    with pytest.raises(InvalidInput) as refused:
        new_task(body(max_attempts=6), client_id="c", settings=SETTINGS)
    assert refused.value.extra == {"field": "max_attempts"}
    clamped = new_task(body(max_attempts=6), client_id="c", settings=SETTINGS, above_cap="clamp")
    assert clamped.max_attempts == 5


def test_a_past_run_at_is_dropped_when_the_api_gives_now() -> None:
    now = 1_709_247_600_000  # 2024-02-29T23:00:00Z
    past, future = body(run_at="2024-02-29T22:59:59Z"), body(run_at="2024-02-29T23:00:01Z")
    assert new_task(past, client_id="c", settings=SETTINGS, now_ms=now).run_at is None
    assert new_task(future, client_id="c", settings=SETTINGS, now_ms=now).run_at == now + 1000


def test_a_past_run_at_is_kept_without_now_as_a_schedule_slot_is() -> None:
    past = body(run_at="2024-02-29T22:59:59Z")
    assert new_task(past, client_id="c", settings=SETTINGS).run_at == 1_709_247_599_000


@pytest.mark.parametrize("digits", ["4102444800", "4102444800000", "0", "-1", "4102444800.5",
                                    "2032"])
def test_a_run_at_written_as_a_number_is_refused(digits: str) -> None:
    with pytest.raises(ValidationError) as refused:
        body(run_at=digits)
    assert [error["loc"] for error in refused.value.errors()] == [("run_at",)]
