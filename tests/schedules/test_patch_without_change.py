"""A `PATCH /v1/schedules/{id}` that changes nothing changes nothing (docs/http-api.md,
schedules): `200` with the schedule as it was, `updated_at` included; a real change
still moves it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.schedules.helpers import Caller

CRON = "30 7 * * mon-fri"


def _create(alice: Caller, model_id: str) -> dict[str, Any]:
    body = {"cron": CRON, "catch_up": 3, "request": {"model": model_id, "input": "words=2"}}
    schedule: dict[str, Any] = alice.post("/v1/schedules", json=body).json()
    time.sleep(0.005)  # a write after this is stamped at a later millisecond
    return schedule


@pytest.mark.parametrize("changes", [
    {},
    {"catch_up": 3},
    {"cron": CRON},
    {"cron": " 30  7 * * MON-FRI "},  # the same expression once normalised
    {"cron": "30 7 * * mon-fri", "catch_up": 3},
], ids=["empty", "same-catch-up", "same-cron", "same-cron-spelt-otherwise", "both-same"])
def test_a_patch_that_changes_nothing_answers_the_schedule_as_it_was(
    alice: Caller, model_id: str, changes: dict[str, Any]
) -> None:
    before = _create(alice, model_id)
    answer = alice.patch(f"/v1/schedules/{before['id']}", json=changes)
    assert answer.status_code == 200
    assert answer.json() == before
    assert alice.get(f"/v1/schedules/{before['id']}").json() == before


def test_a_patch_that_changes_one_value_moves_updated_at(alice: Caller, model_id: str) -> None:
    before = _create(alice, model_id)
    after = alice.patch(f"/v1/schedules/{before['id']}",
                        json={"cron": CRON, "catch_up": 4}).json()
    assert after["catch_up"] == 4 and after["updated_at"] > before["updated_at"]
    assert {**after, "catch_up": 3, "updated_at": before["updated_at"]} == before
