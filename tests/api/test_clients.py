"""Pairing, tokens, scopes and revocation (docs/http-api.md, authentication and scopes)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from litestar.testing import TestClient
from sqlalchemy import select

from core.clients import DEFAULT_SCOPES, MAX_PAIRING_FAILURES
from core.settings import Settings
from core.store.clients import create_client, create_pairing_code, first_start_admin_code, revoke
from core.store.database import Database
from core.tables import clients
from tests.api.helpers import Caller, caller

USER_SCOPES = frozenset({"responses:create", "tasks:read"})


def pair(http: TestClient[Any], code: str, name: str = "laptop") -> Any:
    return http.post("/v1/pair", json={"code": code, "name": name})


def test_a_pairing_code_yields_a_working_token(db: Database, http: TestClient[Any]) -> None:
    code = create_pairing_code(db, scopes=USER_SCOPES, ttl_seconds=60).code
    answer = pair(http, code)
    assert answer.status_code == 201
    issued = answer.json()
    assert set(issued) == {"client_id", "token", "scopes"}
    assert issued["scopes"] == sorted(USER_SCOPES)
    assert Caller(http, issued["token"], issued["client_id"]).get("/v1/tasks").status_code == 200


def test_a_pairing_code_works_once(db: Database, http: TestClient[Any]) -> None:
    code = create_pairing_code(db, scopes=USER_SCOPES, ttl_seconds=60).code
    assert pair(http, code).status_code == 201
    again = pair(http, code)
    assert (again.status_code, again.json()["code"]) == (401, "invalid_pairing_code")


def test_an_expired_pairing_code_is_refused(db: Database, http: TestClient[Any]) -> None:
    code = create_pairing_code(db, scopes=USER_SCOPES, ttl_seconds=0.001).code
    time.sleep(0.01)
    assert pair(http, code).status_code == 401


def test_a_pairing_code_is_burnt_after_five_wrong_secrets(
    db: Database, http: TestClient[Any]
) -> None:
    code = create_pairing_code(db, scopes=USER_SCOPES, ttl_seconds=60).code
    code_id = code.split("-", 1)[0]
    for _ in range(MAX_PAIRING_FAILURES):
        assert pair(http, f"{code_id}-wrongsecret").status_code == 401
    assert pair(http, code).status_code == 401


def test_four_wrong_secrets_do_not_burn_the_code(db: Database, http: TestClient[Any]) -> None:
    code = create_pairing_code(db, scopes=USER_SCOPES, ttl_seconds=60).code
    code_id = code.split("-", 1)[0]
    for _ in range(MAX_PAIRING_FAILURES - 1):
        pair(http, f"{code_id}-wrongsecret")
    assert pair(http, code).status_code == 201


def test_tokens_are_random_and_stored_only_as_hashes(db: Database) -> None:
    issued = create_client(db, name="x", scopes=USER_SCOPES)
    assert len(issued.token) >= 43  # 32 bytes of randomness, base64
    with db.read() as conn:
        stored = conn.execute(select(clients.c.token_hash)).scalars().all()
    assert issued.token not in stored and all(len(value) == 64 for value in stored)


def test_an_admin_mints_pairing_codes_over_http(admin: Caller, http: TestClient[Any]) -> None:
    answer = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:read"], "name": "ci"})
    assert answer.status_code == 201
    assert set(answer.json()) >= {"code", "expires_at"}
    assert pair(http, answer.json()["code"]).json()["scopes"] == ["tasks:read"]


def test_a_pairing_code_needs_no_body(admin: Caller, http: TestClient[Any]) -> None:
    answer = admin.post("/v1/pairing-codes")
    assert answer.status_code == 201
    assert set(pair(http, answer.json()["code"]).json()["scopes"]) == set(DEFAULT_SCOPES)


def test_a_code_no_longer_redeems_once_the_client_that_made_it_is_revoked(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    """A client about to be revoked cannot mint codes ahead and come back with them."""
    clerk = caller(db, http, "clients:admin", "tasks:read")
    kept, spent_first = (clerk.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]})
                         .json()["code"] for _ in range(2))
    assert pair(http, spent_first).status_code == 201
    operators = create_pairing_code(db, scopes=frozenset({"tasks:read"}), ttl_seconds=60)

    assert admin.delete(f"/v1/clients/{clerk.id}").status_code == 204

    refused = pair(http, kept)
    assert (refused.status_code, refused.json()["code"]) == (401, "invalid_pairing_code")
    assert pair(http, operators.code).status_code == 201  # an operator's code has no maker


def test_a_clients_admin_cannot_grant_scopes_it_lacks(db: Database, http: TestClient[Any]) -> None:
    clerk = caller(db, http, "clients:admin")
    answer = clerk.post("/v1/pairing-codes", json={"scopes": ["admin"]})
    assert (answer.status_code, answer.json()["code"]) == (403, "scope_not_held")


def test_unknown_scopes_are_refused(admin: Caller) -> None:
    answer = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:everything"]})
    assert (answer.status_code, answer.json()["code"]) == (422, "unknown_scope")


def test_an_unknown_scope_is_named_by_its_place_never_repeated(admin: Caller) -> None:
    sent = "Z" * 10_000 + "<script>"
    answer = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:read", sent]})
    assert (answer.status_code, answer.json()["code"]) == (422, "unknown_scope")
    assert answer.json()["detail"].startswith("scopes[1] is not a known scope; known: ")
    assert "ZZZ" not in answer.text and "script" not in answer.text


def test_a_revoked_client_is_refused(admin: Caller, alice: Caller) -> None:
    assert alice.get("/v1/tasks").status_code == 200
    assert admin.delete(f"/v1/clients/{alice.id}").status_code == 204
    refused = alice.get("/v1/tasks")
    assert (refused.status_code, refused.json()["code"]) == (401, "invalid_token")
    listed = {c["id"]: c for c in admin.get("/v1/clients").json()["data"]}
    assert listed[alice.id]["revoked_at"] is not None


def test_a_revocation_by_another_process_is_honoured_within_the_poll_interval(
    db: Database, alice: Caller, settings: Settings
) -> None:
    assert alice.get("/v1/tasks").status_code == 200  # now cached by the app
    revoke(db, alice.id)  # as `taskward clients revoke` would, outside the app
    time.sleep(settings.poll_interval_ms / 1000 + 0.05)
    assert alice.get("/v1/tasks").status_code == 401


def test_revoking_an_unknown_client_is_404(admin: Caller) -> None:
    assert admin.delete("/v1/clients/cli_0000000000unknown").status_code == 404


def test_first_start_offers_an_admin_code_until_an_admin_exists(
    db: Database, settings: Settings, http: TestClient[Any]
) -> None:
    code = first_start_admin_code(db, settings)
    assert code is not None
    admin_client = pair(http, code).json()
    assert admin_client["scopes"] == ["admin"]
    assert first_start_admin_code(db, settings) is None
    revoke(db, admin_client["client_id"])
    assert first_start_admin_code(db, settings) is not None


@pytest.mark.parametrize("name", ["line\nbreak", "esc\x1b[31m", "csi\x9b31m", "del\x7f"])
def test_a_name_with_a_control_character_is_refused(
    db: Database, http: TestClient[Any], admin: Caller, name: str
) -> None:
    """A name reaches an operator's terminal (`clients list`): C1's `\\x9b` opens an
    escape sequence as C0's `\\x1b[` does."""
    code = create_pairing_code(db, scopes=frozenset({"tasks:read"}), ttl_seconds=60).code
    refused = pair(http, code, name=name)
    assert (refused.status_code, refused.json()["code"]) == (422, "validation_error")
    minted = admin.post("/v1/pairing-codes", json={"name": name})
    assert (minted.status_code, minted.json()["code"]) == (422, "validation_error")
    assert pair(http, code, name="plain").status_code == 201  # the refusal spent nothing


def test_clients_are_listed_a_page_at_a_time(db: Database, admin: Caller) -> None:
    """The whole table came in one answer: megabytes once clients come and go."""
    made = {create_client(db, name=f"client {n}", scopes=DEFAULT_SCOPES).client_id
            for n in range(25)}
    first = admin.get("/v1/clients").json()
    assert len(first["data"]) == 20 and first["next_cursor"] is not None
    rest = admin.get("/v1/clients", params={"after": first["next_cursor"],
                                            "limit": 100}).json()
    listed = [c["id"] for c in first["data"] + rest["data"]]
    assert rest["next_cursor"] is None and len(listed) == len(set(listed))
    assert made | {admin.id} == set(listed)
    assert admin.get("/v1/clients", params={"limit": 101}).status_code == 422
