"""`priority` and its OpenAI alias `service_tier` on `POST /v1/responses`, both stores."""

from __future__ import annotations

import pytest

from core.store.database import Database
from tests.api.helpers import Caller, start_due


@pytest.mark.parametrize(("fields", "priority", "tier"), [
    ({}, 5, None),
    ({"priority": 0}, 0, None),
    ({"service_tier": "priority"}, 1, "priority"),
    ({"service_tier": "auto"}, 5, "auto"),
    ({"service_tier": "flex"}, 8, "flex"),
    ({"service_tier": "flex", "priority": 8}, 8, "flex"),
])
def test_the_priority_is_shown_on_the_task_and_the_tier_echoed(
    alice: Caller, model_id: str, fields: dict[str, object], priority: int, tier: str | None
) -> None:
    created = alice.post("/v1/responses", json={"model": model_id, "input": "hi", **fields})
    assert created.status_code == 202
    assert created.json()["service_tier"] == tier
    assert alice.get(f"/v1/tasks/{created.json()['id']}").json()["priority"] == priority


@pytest.mark.parametrize("fields", [{"priority": 10}, {"priority": -1}, {"priority": 2.5},
                                    {"service_tier": "scale"},
                                    {"service_tier": "flex", "priority": 1}])
def test_a_bad_priority_is_refused_and_nothing_is_stored(
    alice: Caller, model_id: str, fields: dict[str, object]
) -> None:
    refused = alice.post("/v1/responses", json={"model": model_id, "input": "hi", **fields})
    assert refused.status_code == 422 and refused.json()["code"] == "validation_error"
    assert alice.get("/v1/tasks").json()["data"] == []


def test_task_lists_filter_by_priority(alice: Caller, model_id: str) -> None:
    low = alice.post("/v1/responses", json={"model": model_id, "input": "hi",
                                            "priority": 9}).json()["id"]
    alice.post("/v1/responses", json={"model": model_id, "input": "hi"})
    assert [t["id"] for t in alice.get("/v1/tasks?priority=9").json()["data"]] == [low]
    assert alice.get("/v1/tasks?priority=12").status_code == 422


def test_a_higher_priority_request_is_claimed_first(
    db: Database, alice: Caller, model_id: str
) -> None:
    for _ in range(3):
        alice.post("/v1/responses", json={"model": model_id, "input": "hi",
                                          "service_tier": "flex"})
    urgent = alice.post("/v1/responses", json={"model": model_id, "input": "hi",
                                               "service_tier": "priority"}).json()["id"]
    assert start_due(db)[0].task_id == urgent
