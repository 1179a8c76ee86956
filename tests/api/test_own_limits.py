"""A client without `admin` cannot change its own limits, `clients:admin` or not
(docs/http-api.md, `PATCH /v1/clients/{id}`): it manages other clients, it does not lift
the quotas it was given."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from core.store.database import Database
from tests.api.helpers import Caller, caller
from tests.api.test_errors import assert_problem


def _shown(admin: Caller, client_id: str) -> dict[str, Any]:
    [shown] = [c for c in admin.get("/v1/clients").json()["data"] if c["id"] == client_id]
    return shown


def test_a_clients_admin_cannot_change_its_own_limits(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    tenant = caller(db, http, "clients:admin", "responses:create")
    assert admin.patch(f"/v1/clients/{tenant.id}", json={"max_active_tasks": 5}).status_code == 200
    for change in ({"max_active_tasks": 0}, {"max_active_tasks": None},
                   {"requests_per_second": 0}, {"max_streams": 1}, {}):
        refused = tenant.patch(f"/v1/clients/{tenant.id}", json=change)
        assert_problem(refused, 403, "own_limits_refused")
    shown = _shown(admin, tenant.id)
    assert (shown["max_active_tasks"], shown["requests_per_second"],
            shown["max_streams"]) == (5, None, None)


def test_a_clients_admin_still_limits_other_clients_and_an_admin_itself(
    db: Database, http: TestClient[Any], admin: Caller, alice: Caller
) -> None:
    tenant = caller(db, http, "clients:admin")
    changed = tenant.patch(f"/v1/clients/{alice.id}", json={"max_active_tasks": 2})
    assert changed.status_code == 200 and changed.json()["max_active_tasks"] == 2
    mine = admin.patch(f"/v1/clients/{admin.id}", json={"max_streams": 3})
    assert mine.status_code == 200 and mine.json()["max_streams"] == 3
