"""A client without `admin` never sets nor hands out a limit looser than its own
(docs/http-api.md, `403 limits_exceed_own`): a tenant refused its own limits
(`own_limits_refused`) must not lift them through a `clients:admin` client it pairs,
nor pair unlimited workers."""

from __future__ import annotations

from typing import Any

from litestar.testing import TestClient

from core.quotas import Limits
from core.store.clients import create_client
from core.store.database import Database
from tests.api.helpers import Caller
from tests.api.test_errors import assert_problem

# A rate of 100 holds a burst of 100 requests: the tests never wait on it.
TENANT_LIMITS = {"max_active_tasks": 2, "requests_per_second": 100, "max_streams": 1}
UNLIMITED = {"max_active_tasks": 0, "requests_per_second": 0, "max_streams": 1_000_000}


def _tenant(db: Database, http: TestClient[Any]) -> Caller:
    """A client an operator gave `clients:admin` and limits of its own."""
    issued = create_client(db, name="tenant", limits=Limits(**TENANT_LIMITS),
                           scopes=frozenset({"clients:admin", "responses:create", "tasks:read"}))
    return Caller(http, issued.token, issued.client_id)


def _paired(http: TestClient[Any], maker: Caller, body: dict[str, Any]) -> Caller:
    made = maker.post("/v1/pairing-codes", json=body)
    assert made.status_code == 201, made.text
    issued = http.post("/v1/pair", json={"code": made.json()["code"]}).json()
    return Caller(http, issued["token"], issued["client_id"])


def _limits_of(admin: Caller, client_id: str) -> dict[str, Any]:
    [shown] = [c for c in admin.get("/v1/clients").json()["data"] if c["id"] == client_id]
    return {name: shown[name] for name in TENANT_LIMITS}


def test_the_escalation_through_a_paired_clients_admin_is_refused_at_each_step(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    tenant = _tenant(db, http)
    looser: dict[str, Any]
    # A code's limits left out are the defaults (unlimited tasks and rate, 100 streams).
    for looser in ({}, UNLIMITED, {**TENANT_LIMITS, "max_active_tasks": 0},
                   {**TENANT_LIMITS, "max_active_tasks": 3},
                   {**TENANT_LIMITS, "requests_per_second": 100.5},
                   {**TENANT_LIMITS, "max_streams": None}):
        refused = tenant.post("/v1/pairing-codes", json={"scopes": ["clients:admin"], **looser})
        assert assert_problem(refused, 403, "limits_exceed_own")["field"] in TENANT_LIMITS
    assert tenant.get("/v1/pairing-codes").json()["data"] == []

    sibling = _paired(http, tenant, {"scopes": ["clients:admin"], **TENANT_LIMITS})
    for looser in (UNLIMITED, {"max_active_tasks": 0}, {"requests_per_second": 0},
                   {"max_streams": 2}, {"max_active_tasks": None}, {"max_streams": None}):
        refused = sibling.patch(f"/v1/clients/{tenant.id}", json=looser)
        assert_problem(refused, 403, "limits_exceed_own")
    assert _limits_of(admin, tenant.id) == TENANT_LIMITS


def test_equal_or_tighter_limits_are_set_and_handed_out(
    db: Database, http: TestClient[Any], admin: Caller, alice: Caller
) -> None:
    tenant = _tenant(db, http)
    worker = _paired(http, tenant, {"scopes": ["responses:create"], "max_active_tasks": 1,
                                    "requests_per_second": 50, "max_streams": 1})
    assert _limits_of(admin, worker.id) == {"max_active_tasks": 1, "requests_per_second": 50,
                                            "max_streams": 1}
    sibling = _paired(http, tenant, {"scopes": ["clients:admin"], **TENANT_LIMITS})
    tighter = sibling.patch(f"/v1/clients/{tenant.id}",
                            json={"max_active_tasks": 1, "requests_per_second": 50})
    assert tighter.status_code == 200, tighter.text
    assert _limits_of(admin, tenant.id) == {"max_active_tasks": 1, "requests_per_second": 50,
                                            "max_streams": 1}
    # Only the limits sent are judged: alice's unlimited defaults stay as they are.
    changed = tenant.patch(f"/v1/clients/{alice.id}", json={"max_streams": 1})
    assert changed.status_code == 200, changed.text
    assert _limits_of(admin, alice.id) == {"max_active_tasks": None,
                                           "requests_per_second": None, "max_streams": 1}


def test_an_admin_sets_and_hands_out_any_limits(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    tenant = _tenant(db, http)
    lifted = admin.patch(f"/v1/clients/{tenant.id}", json=UNLIMITED)
    assert lifted.status_code == 200, lifted.text
    worker = _paired(http, admin, {"scopes": ["responses:create"], **UNLIMITED})
    assert _limits_of(admin, worker.id) == UNLIMITED
    unlimited_tenant = _paired(http, admin, {"scopes": ["clients:admin"]})
    assert _paired(http, unlimited_tenant, {"scopes": ["clients:admin"]}).id
