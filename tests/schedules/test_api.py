"""`/v1/schedules` over HTTP: validation with the field named, ownership, paging."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient

from core.clock import iso, parse_iso
from core.cron import next_slot, parse_cron
from core.store.database import Database
from tests.schedules.helpers import Caller, caller


def body(model: str, cron: str = "30 7 * * 1-5", **fields: Any) -> dict[str, Any]:
    request = {"model": model, "input": "words=2", **fields.pop("request", {})}
    return {"cron": cron, "request": request, **fields}


def first_slot_after(cron: str, moment: str) -> str | None:
    return iso(next_slot(parse_cron(cron), parse_iso(moment)))


def test_creating_answers_201_with_the_schedule_and_its_first_slot(
    alice: Caller, model_id: str
) -> None:
    answer = alice.post("/v1/schedules", json=body(model_id, cron=" 30  7 * * MON-FRI "))
    assert answer.status_code == 201
    schedule = answer.json()
    assert answer.headers["location"] == f"/v1/schedules/{schedule['id']}"
    assert schedule == {
        "id": schedule["id"], "object": "schedule", "cron": "30 7 * * mon-fri",
        "request": {"model": model_id, "input": "words=2", "on_restart": "retry",
                    "metadata": {}, "background": True, "stream": False},
        "catch_up": 1,
        "next_run_at": first_slot_after("30 7 * * 1-5", schedule["created_at"]),
        "created_at": schedule["created_at"], "updated_at": schedule["created_at"],
        "client_id": alice.client_id,
    }
    assert alice.get(f"/v1/schedules/{schedule['id']}").json() == schedule


@pytest.mark.parametrize("cron", [
    "61 * * * *", "* * *", "0 0 30 2 *", "0 0 31 4,6,9,11 *", "@reboot", "*/0 * * * *",
    "0 0 L * *", "5/10 * * * *", "", "0 25 * * *",
])
def test_a_bad_cron_is_422_invalid_cron_naming_the_field(
    alice: Caller, model_id: str, cron: str
) -> None:
    answer = alice.post("/v1/schedules", json=body(model_id, cron=cron))
    assert answer.status_code == 422
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert (answer.json()["code"], answer.json()["field"]) == ("invalid_cron", "cron")


@pytest.mark.parametrize(("fields", "field"), [
    ({"catch_up": 0}, "catch_up"),
    ({"catch_up": 101}, "catch_up"),
    ({"colour": "blue"}, "colour"),
    ({"cron": 5}, "cron"),
    ({"request": {"temperature": 9}}, "request.temperature"),
    ({"request": {"surprise": 1}}, "request.surprise"),
    ({"request": {"run_at": "2030-01-01T00:00:00Z"}}, "request.run_at"),
    ({"request": {"background": False}}, "request.background"),
    ({"request": {"stream": True}}, "request.stream"),
    ({"request": {"max_attempts": 11}}, "request.max_attempts"),
])
def test_an_invalid_body_is_422_validation_error_naming_the_field(
    alice: Caller, model_id: str, fields: dict[str, Any], field: str
) -> None:
    answer = alice.post("/v1/schedules", json=body(model_id, **fields))
    assert answer.status_code == 422
    problem = answer.json()
    assert (problem["code"], problem["field"]) == ("validation_error", field)
    assert field in problem["detail"]


def test_a_request_without_its_required_fields_is_422(alice: Caller) -> None:
    answer = alice.post("/v1/schedules", json={"cron": "* * * * *", "request": {}})
    assert answer.status_code == 422
    assert answer.json()["field"] in {"request.model", "request.input"}


def test_an_unknown_model_is_422_model_not_found_and_nothing_is_stored(alice: Caller) -> None:
    answer = alice.post("/v1/schedules", json=body("no-such-model"))
    assert answer.status_code == 422
    assert (answer.json()["code"], answer.json()["field"]) == ("model_not_found", "request.model")
    assert alice.get("/v1/schedules").json()["data"] == []


def test_a_client_sees_only_its_own_schedules(alice: Caller, bob: Caller, model_id: str) -> None:
    mine = alice.post("/v1/schedules", json=body(model_id)).json()["id"]
    assert bob.get("/v1/schedules").json()["data"] == []
    for answer in (bob.get(f"/v1/schedules/{mine}"), bob.delete(f"/v1/schedules/{mine}"),
                   bob.patch(f"/v1/schedules/{mine}", json={"catch_up": 2})):
        assert (answer.status_code, answer.json()["code"]) == (404, "schedule_not_found")
    assert alice.get(f"/v1/schedules/{mine}").json()["catch_up"] == 1


def test_an_admin_sees_every_clients_schedules(
    db: Database, http: TestClient[Any], alice: Caller, model_id: str
) -> None:
    mine = alice.post("/v1/schedules", json=body(model_id)).json()["id"]
    admin = caller(db, http, "admin")
    assert [s["id"] for s in admin.get("/v1/schedules").json()["data"]] == [mine]


def test_schedules_need_the_responses_create_scope(
    db: Database, http: TestClient[Any], model_id: str
) -> None:
    reader = caller(db, http, "tasks:read")
    assert reader.post("/v1/schedules", json=body(model_id)).status_code == 403
    assert reader.get("/v1/schedules").status_code == 403
    assert http.get("/v1/schedules").status_code == 401


def test_pages_run_newest_first_with_a_cursor(alice: Caller, model_id: str) -> None:
    made = [alice.post("/v1/schedules", json=body(model_id)).json()["id"] for _ in range(5)]
    first = alice.get("/v1/schedules", params={"limit": 3}).json()
    second = alice.get("/v1/schedules",
                       params={"limit": 3, "after": first["next_cursor"]}).json()
    assert [s["id"] for s in first["data"] + second["data"]] == made[::-1]
    assert second["next_cursor"] is None
    assert alice.get("/v1/schedules", params={"limit": 0}).status_code == 422


def test_deleting_answers_204_then_404(alice: Caller, model_id: str) -> None:
    sid = alice.post("/v1/schedules", json=body(model_id)).json()["id"]
    assert alice.delete(f"/v1/schedules/{sid}").status_code == 204
    assert alice.get(f"/v1/schedules/{sid}").status_code == 404
    assert alice.delete(f"/v1/schedules/{sid}").status_code == 404


def test_patching_the_cron_restarts_it_from_now(alice: Caller, model_id: str) -> None:
    sid = alice.post("/v1/schedules", json=body(model_id, cron="0 0 1 1 *")).json()["id"]
    changed = alice.patch(f"/v1/schedules/{sid}", json={"cron": "@hourly", "catch_up": 4})
    assert changed.status_code == 200
    schedule = changed.json()
    assert (schedule["cron"], schedule["catch_up"]) == ("0 * * * *", 4)
    assert schedule["next_run_at"] == first_slot_after("0 * * * *", schedule["updated_at"])
    bad = alice.patch(f"/v1/schedules/{sid}", json={"cron": "0 0 31 2 *"})
    assert (bad.status_code, bad.json()["code"], bad.json()["field"]) == (422, "invalid_cron",
                                                                          "cron")
    assert alice.get(f"/v1/schedules/{sid}").json() == schedule


@pytest.mark.parametrize("schedule_id", ["nope", "sched_" + "x" * 60, "SCHED_ABC"])
def test_an_id_no_schedule_can_have_is_refused_before_the_store(
    alice: Caller, schedule_id: str
) -> None:
    assert alice.get(f"/v1/schedules/{schedule_id}").status_code in {404, 422}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cron=st.sampled_from(["* * * * *", "0 0 29 2 *"]) | st.text(max_size=30) | _json,
       catch_up=st.integers(0, 101) | _json,
       request=st.fixed_dictionaries({}, optional={
           "model": st.sampled_from(["words", "nope"]) | _json, "input": _json,
           "temperature": _json, "run_at": _json, "metadata": _json}))
def test_no_body_makes_a_server_error(
    alice: Caller, model_id: str, cron: Any, catch_up: Any, request: Any
) -> None:
    answer = alice.post("/v1/schedules",
                        json={"cron": cron, "request": request, "catch_up": catch_up})
    assert answer.status_code in {201, 422}, answer.text
