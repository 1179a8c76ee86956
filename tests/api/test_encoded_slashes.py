"""An id hiding an encoded slash (`%2F`) names nothing: it is `404` with its route's
code, and never reaches the route its decoded path would name (docs/http-api.md)."""

from __future__ import annotations

import pytest

from tests.api.helpers import Caller
from tests.api.served import Service
from tests.api.test_errors import assert_problem
from tests.api.test_served import create, task_status, token_client


def queued_task(who: Caller, model_id: str) -> str:
    created = who.post("/v1/responses", json={"model": model_id, "input": "words=3",
                                              "run_at": "2100-01-01T00:00:00Z"})
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


@pytest.mark.parametrize("slash", ["%2F", "%2f"])
def test_an_id_with_an_encoded_slash_does_not_reach_the_cancel_route(
    alice: Caller, model_id: str, slash: str
) -> None:
    task_id = queued_task(alice, model_id)

    assert_problem(alice.get(f"/v1/tasks/{task_id}{slash}cancel"), 404, "task_not_found")
    assert_problem(alice.post(f"/v1/responses/{task_id}{slash}cancel"), 404, "task_not_found")
    assert_problem(alice.post(f"/v1/tasks/{task_id}{slash}cancel"), 404, "task_not_found")

    assert alice.get(f"/v1/tasks/{task_id}").json()["status"] == "queued"


@pytest.mark.parametrize(("method", "path", "code"), [
    ("GET", "/v1/tasks/resp_abc%2Fcancel", "task_not_found"),
    ("GET", "/v1/tasks/resp_abc%2Fevents", "task_not_found"),
    ("GET", "/v1/responses/resp_abc%2F", "task_not_found"),
    ("DELETE", "/v1/clients/cli_abc%2Fx", "client_not_found"),
    ("GET", "/v1/schedules/sched_abc%2Fx", "schedule_not_found"),
    ("DELETE", "/v1/pairing-codes/pc_abc%2Fx", "pairing_code_not_found"),
    ("GET", "/v1/tasks%2Fresp_abc", "not_found"),
    ("GET", "/v1/dead-letters%2F", "not_found"),
])
def test_an_encoded_slash_under_v1_is_404_before_routing(
    admin: Caller, method: str, path: str, code: str
) -> None:
    assert_problem(admin.request(method, path), 404, code)




def test_a_real_server_refuses_an_encoded_slash_before_routing(service: Service) -> None:
    """The server, not only the test client, hands over the raw path the check reads."""
    client, _ = token_client(service)
    task_id = create(client, run_at="2100-01-01T00:00:00Z").json()["id"]

    assert_problem(client.get("/v1/tasks/resp_abc%2Fcancel"), 404, "task_not_found")
    assert_problem(client.post(f"/v1/responses/{task_id}%2Fcancel"), 404, "task_not_found")
    assert task_status(client, task_id) == "queued"
