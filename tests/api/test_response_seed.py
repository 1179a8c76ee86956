"""The response object shows the seed its task samples with (docs/http-api.md), on both
stores: the request's, or the one drawn when the task was created, the same in every
place the object appears. That it is the seed the engine used is shown on the real
model (tests/engine/test_fmo_default_model_sampling.py)."""

from __future__ import annotations

from core.store.database import Database
from tests.api.helpers import Caller, complete_due


def test_the_seed_a_request_names_is_shown(alice: Caller, model_id: str) -> None:
    created = alice.post("/v1/responses", json={"model": model_id, "input": "words=2",
                                                "seed": 42}).json()

    assert created["seed"] == 42
    assert alice.get(f"/v1/responses/{created['id']}").json()["seed"] == 42


def test_a_request_without_a_seed_shows_the_one_drawn_for_it_everywhere(
    alice: Caller, model_id: str, db: Database
) -> None:
    created = alice.post("/v1/responses", json={"model": model_id, "input": "words=2"}).json()
    complete_due(db)

    seed = created["seed"]
    events = alice.get(f"/v1/tasks/{created['id']}/events").json()["data"]
    assert isinstance(seed, int) and 0 <= seed < 2**63
    assert alice.get(f"/v1/responses/{created['id']}").json()["seed"] == seed
    embedded = {e["type"]: e["data"]["response"]["seed"] for e in events
                if "response" in e["data"]}
    assert {"response.created", "response.completed"} <= set(embedded)
    assert set(embedded.values()) == {seed}
