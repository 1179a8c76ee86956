"""An Idempotency-Key replays a body whose numbers are spelled differently but are
equal (`1` and `1.0`): the digest is over the canonical body (docs/http-api.md)."""

from __future__ import annotations

from tests.api.helpers import Caller


def test_a_retry_spelling_a_whole_number_as_a_float_is_a_replay(
    alice: Caller, model_id: str
) -> None:
    headers = {"Idempotency-Key": "temperature-one", "Content-Type": "application/json"}
    body = '{"model":"%s","input":"words=3","temperature":%s}'
    first = alice.post("/v1/responses", content=body % (model_id, "1"), headers=headers)
    again = alice.post("/v1/responses", content=body % (model_id, "1.0"), headers=headers)

    assert (first.status_code, again.status_code) == (202, 202), again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert len(alice.get("/v1/tasks").json()["data"]) == 1
