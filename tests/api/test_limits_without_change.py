"""A `PATCH /v1/clients/{id}` that changes no limit changes nothing (docs/http-api.md,
client): `200` with the client as it is, and the token caches' marker stays, so no
process re-reads its tokens for it. A rate of `-0.0` is held as `0.0` whichever layer
took it (`core.quotas.Limits`)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.quotas import Limits, limit_changes
from core.store.clients import revocations
from core.store.database import Database
from tests.api.helpers import Caller


@pytest.mark.parametrize("changes", [
    {},
    {"max_active_tasks": 5},
    {"requests_per_second": 2.5, "max_streams": None},
    {"max_active_tasks": 5, "requests_per_second": 2.5, "max_streams": None},
], ids=["empty", "one-same", "two-same", "all-same"])
def test_a_patch_that_changes_no_limit_answers_the_client_as_it_is(
    db: Database, admin: Caller, alice: Caller, changes: dict[str, Any]
) -> None:
    before = admin.patch(f"/v1/clients/{alice.id}",
                         json={"max_active_tasks": 5, "requests_per_second": 2.5}).json()
    marker = revocations(db)
    answer = admin.patch(f"/v1/clients/{alice.id}", json=changes)
    assert answer.status_code == 200
    assert answer.json() == before
    assert revocations(db) == marker


def test_a_patch_that_changes_one_limit_moves_the_marker(
    db: Database, admin: Caller, alice: Caller
) -> None:
    admin.patch(f"/v1/clients/{alice.id}", json={"max_active_tasks": 5})
    marker = revocations(db)
    changed = admin.patch(f"/v1/clients/{alice.id}", json={"max_active_tasks": 5,
                                                           "max_streams": 2}).json()
    assert (changed["max_active_tasks"], changed["max_streams"]) == (5, 2)
    assert revocations(db) > marker


def test_a_negative_zero_rate_in_a_pairing_code_is_held_and_listed_as_zero(
    admin: Caller,
) -> None:
    assert admin.post("/v1/pairing-codes", json={"requests_per_second": -0.0}).status_code == 201
    listed = admin.get("/v1/pairing-codes").text
    assert '"requests_per_second":0.0' in listed and "-0.0" not in listed


def test_core_holds_a_negative_zero_rate_as_zero_whoever_builds_it() -> None:
    built = Limits(requests_per_second=-0.0).requests_per_second
    changed = limit_changes({"requests_per_second": -0.0})["requests_per_second"]
    assert built is not None and math.copysign(1, built) == 1
    assert math.copysign(1, changed) == 1
