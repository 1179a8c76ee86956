"""Outstanding pairing codes, listed and revoked (docs/http-api.md, `GET` and `DELETE
/v1/pairing-codes`): a code pasted into the wrong chat can be found and taken out of
service before it expires."""

from __future__ import annotations

import threading
import time
from typing import Any

from litestar.testing import TestClient

from core.clients import MAX_PAIRING_FAILURES, IssuedCode
from core.errors import NotFound, Unauthorized
from core.ids import hash_secret
from core.store.clients import create_pairing_code, redeem_pairing_code
from core.store.database import Database
from core.store.pairing_codes import revoke_pairing_code
from tests.api.helpers import Caller, caller

SCOPES = frozenset({"tasks:read"})
ITEM_KEYS = {"id", "object", "name", "scopes", "created_at", "expires_at", "created_by",
             "max_active_tasks", "requests_per_second", "max_streams"}
UNKNOWN = "pc_aaaaaaaaaaaaaaaaaaaa-guessedsecret"


def code_id(code: str) -> str:
    return code.split("-", 1)[0]


def pair(http: TestClient[Any], code: str) -> Any:
    return http.post("/v1/pair", json={"code": code})


def listed(by: Caller, **params: Any) -> list[str]:
    answer = by.get("/v1/pairing-codes", params=params)
    assert answer.status_code == 200, answer.text
    return [item["id"] for item in answer.json()["data"]]


def operators_code(db: Database, ttl_seconds: float = 60) -> IssuedCode:
    return create_pairing_code(db, scopes=SCOPES, ttl_seconds=ttl_seconds)


def test_only_codes_that_would_redeem_are_listed_newest_first_without_secrets(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    made = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:read"], "name": "ci",
                                                 "max_streams": 3}).json()["code"]
    operators = operators_code(db).code
    used = operators_code(db).code
    assert pair(http, used).status_code == 201
    burnt = operators_code(db).code
    for _ in range(MAX_PAIRING_FAILURES):
        pair(http, f"{code_id(burnt)}-wrongsecret")
    operators_code(db, ttl_seconds=0.001)
    time.sleep(0.01)  # that one has expired

    answer = admin.get("/v1/pairing-codes")

    assert answer.status_code == 200
    body = answer.json()
    assert body["next_cursor"] is None
    assert [item["id"] for item in body["data"]] == [code_id(operators), code_id(made)]
    newest, oldest = body["data"]
    assert set(oldest) == ITEM_KEYS
    assert (oldest["object"], oldest["name"], oldest["scopes"], oldest["created_by"],
            oldest["max_streams"]) == ("pairing_code", "ci", ["tasks:read"], admin.id, 3)
    assert (newest["name"], newest["created_by"]) == (None, None)  # an operator's
    assert newest["created_at"] <= newest["expires_at"]
    for code in (made, operators):
        secret = code.split("-", 1)[1]
        assert secret not in answer.text and hash_secret(secret) not in answer.text


def test_a_client_without_admin_sees_only_the_codes_it_made(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    clerk = caller(db, http, "clients:admin", "tasks:read")
    clerks = clerk.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]}).json()["code"]
    admins = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]}).json()["code"]
    operators = operators_code(db).code

    assert listed(clerk) == [code_id(clerks)]
    assert set(listed(admin)) == {code_id(clerks), code_id(admins), code_id(operators)}
    assert caller(db, http, "tasks:read").get("/v1/pairing-codes").status_code == 403


def test_codes_are_listed_a_page_at_a_time_even_when_the_last_one_shown_is_revoked(
    db: Database, admin: Caller
) -> None:
    """Ids are random, so the cursor carries the last code's creation time: the next
    page must not need that code to still be there."""
    made = {code_id(operators_code(db).code) for _ in range(25)}
    first = admin.get("/v1/pairing-codes").json()
    assert len(first["data"]) == 20 and first["next_cursor"] is not None
    assert admin.delete(f"/v1/pairing-codes/{first['data'][-1]['id']}").status_code == 204

    rest = admin.get("/v1/pairing-codes", params={"after": first["next_cursor"],
                                                  "limit": 100}).json()

    shown = first["data"] + rest["data"]
    assert rest["next_cursor"] is None and len(rest["data"]) == 5
    assert {item["id"] for item in shown} == made and len(shown) == len(made)
    created = [item["created_at"] for item in shown]
    assert created == sorted(created, reverse=True)
    for after in ("pc_aaaaaaaaaaaaaaaaaaaa", "pcc_12", "task_0123"):
        refused = admin.get("/v1/pairing-codes", params={"after": after})
        assert (refused.status_code, refused.json()["code"]) == (422, "validation_error")
    assert admin.get("/v1/pairing-codes", params={"limit": 101}).status_code == 422


def test_a_revoked_code_is_refused_as_an_unknown_code_is(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    code = operators_code(db).code

    assert admin.delete(f"/v1/pairing-codes/{code_id(code)}").status_code == 204

    refused, unknown = pair(http, code), pair(http, UNKNOWN)
    assert refused.status_code == unknown.status_code == 401
    assert refused.json() == unknown.json()
    assert listed(admin) == []


def test_a_minted_code_answers_the_id_its_maker_revokes_it_by(
    http: TestClient[Any], admin: Caller
) -> None:
    minted = admin.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]}).json()
    assert minted["code"].startswith(minted["id"] + "-")
    assert listed(admin) == [minted["id"]]

    assert admin.delete(f"/v1/pairing-codes/{minted['id']}").status_code == 204
    assert pair(http, minted["code"]).status_code == 401


def test_revoking_a_code_that_is_not_outstanding_or_not_yours_is_404_and_changes_nothing(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    clerk = caller(db, http, "clients:admin", "tasks:read")
    revoked = operators_code(db).code
    admin.delete(f"/v1/pairing-codes/{code_id(revoked)}")
    used = operators_code(db).code
    pair(http, used)
    expired = operators_code(db, ttl_seconds=0.001).code
    time.sleep(0.01)
    admins = operators_code(db).code
    for by, code_or_id in [(admin, revoked), (admin, used), (admin, expired),
                           (admin, UNKNOWN), (admin, "nothing-like-an-id"), (admin, "x" * 5000),
                           (clerk, admins)]:
        answer = by.delete(f"/v1/pairing-codes/{code_id(code_or_id)}")
        assert (answer.status_code, answer.json()["code"]) == (404, "pairing_code_not_found")
    assert listed(admin) == [code_id(admins)]
    assert pair(http, admins).status_code == 201  # the clerk's attempt spent nothing


def test_a_client_without_admin_revokes_the_codes_it_made(
    db: Database, http: TestClient[Any]
) -> None:
    clerk = caller(db, http, "clients:admin", "tasks:read")
    code = clerk.post("/v1/pairing-codes", json={"scopes": ["tasks:read"]}).json()["code"]
    assert clerk.delete(f"/v1/pairing-codes/{code_id(code)}").status_code == 204
    assert pair(http, code).status_code == 401


def test_a_redeem_racing_a_revocation_either_wins_or_fails_never_both(db: Database) -> None:
    """Each side is given a head start by turns, so that both orders are seen."""
    for turn in range(10):
        code = operators_code(db).code
        outcomes: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def redeem(code: str = code, late: bool = turn % 2 == 0) -> None:
            barrier.wait()
            time.sleep(0.002 if late else 0)
            try:
                outcomes["redeemed"] = bool(redeem_pairing_code(db, code))
            except Unauthorized:
                outcomes["redeemed"] = False

        def revoke(code: str = code, late: bool = turn % 2 == 1) -> None:
            barrier.wait()
            time.sleep(0.002 if late else 0)
            try:
                revoke_pairing_code(db, code_id(code), made_by=None)
                outcomes["revoked"] = True
            except NotFound:
                outcomes["revoked"] = False

        threads = [threading.Thread(target=redeem), threading.Thread(target=revoke)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes.values()) == [False, True], outcomes
