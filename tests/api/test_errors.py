"""Every failure is an RFC 9457 problem with a stable code, and never echoes the input."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from litestar.testing import TestClient

from core.errors import unstorable_value
from core.settings import Settings
from core.store.database import Database
from handlers.errors import problem, problem_of
from infra.app import serving_app
from tests.api.helpers import Caller, caller

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert PROBLEM_KEYS <= body.keys()
    assert (body["status"], body["code"]) == (status, code)
    return body


def test_malformed_json_is_400(alice: Caller, model_id: str) -> None:
    response = alice.post("/v1/responses", content=b'{"model": "words", "input": ',
                          headers={"Content-Type": "application/json"})
    assert_problem(response, 400, "malformed_json")


def test_unknown_field_is_422_naming_it(alice: Caller, model_id: str) -> None:
    response = alice.post("/v1/responses", json={"model": model_id, "input": "hi", "colour": 1})
    body = assert_problem(response, 422, "validation_error")
    assert body["field"] == "colour"


def test_schema_violation_names_the_field_without_echoing_values(
    alice: Caller, model_id: str
) -> None:
    response = alice.post("/v1/responses", json={
        "model": model_id, "input": "SECRET-PROMPT", "temperature": "SECRET-VALUE",
        "on_restart": "SECRET-POLICY"})
    body = assert_problem(response, 422, "validation_error")
    assert {e["field"] for e in body["errors"]} == {"temperature", "on_restart"}
    assert "SECRET" not in response.text


REQUEST = {"model": "words", "input": "hi"}
FAR_OFF = "2099-01-01T00:00:00Z"


@pytest.mark.parametrize(("path", "body", "field", "message"), [
    ("/v1/responses", {**REQUEST, "max_attempts": 11}, "max_attempts", "must be at most 10"),
    ("/v1/schedules", {"cron": "@daily", "request": {**REQUEST, "run_at": FAR_OFF}},
     "request.run_at", "a schedule's slot decides when its task runs"),
    ("/v1/schedules", {"cron": "@daily", "catch_up": 0, "request": REQUEST}, "catch_up",
     "Input should be greater than or equal to 1"),
    ("/v1/models", {"id": "no-file"}, "path", "path (a model file) or upstream is required"),
])
def test_a_validation_error_the_domain_finds_lists_its_errors_as_the_schemas_do(
    admin: Caller, model_id: str, path: str, body: dict[str, Any], field: str, message: str,
) -> None:
    problem_body = assert_problem(admin.post(path, json=body), 422, "validation_error")
    assert problem_body["field"] == field
    assert problem_body["errors"] == [{"field": field, "message": message}]


def test_a_validation_error_naming_no_field_is_told_as_the_bodys() -> None:
    answer = problem_of(unstorable_value())
    assert isinstance(answer.extra, dict)
    assert answer.extra["field"] == "body"
    assert answer.extra["errors"] == [{"field": "body", "message": answer.detail}]


def test_body_over_the_limit_is_413(settings: Settings, db: Database, model_id: str) -> None:
    small = replace(settings, max_body_bytes=2048)
    with TestClient(serving_app(small)) as http:
        sender = caller(db, http, "responses:create")
        response = sender.post("/v1/responses", content=b"{" + b" " * 4096 + b"}",
                               headers={"Content-Type": "application/json"})
    assert_problem(response, 413, "body_too_large")


def test_missing_token_is_401_with_a_bearer_challenge(http: TestClient[Any]) -> None:
    response = http.get("/v1/tasks")
    assert_problem(response, 401, "missing_token")
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_token_is_401(http: TestClient[Any]) -> None:
    response = http.get("/v1/tasks", headers={"Authorization": "Bearer tw_not-a-real-token"})
    assert_problem(response, 401, "invalid_token")


def test_missing_scope_is_403(alice: Caller) -> None:
    assert_problem(alice.get("/v1/clients"), 403, "missing_scope")


def test_unknown_route_and_method_are_problems(alice: Caller) -> None:
    assert_problem(alice.get("/v1/nothing-here"), 404, "not_found")
    assert_problem(alice.put("/v1/tasks"), 405, "method_not_allowed")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422])
def test_client_errors_say_do_not_retry(status: int) -> None:
    assert (problem(status, "x", "y").headers or {})["x-should-retry"] == "false"


@pytest.mark.parametrize("status", [408, 429, 503])
def test_transient_errors_may_be_retried(status: int) -> None:
    assert "x-should-retry" not in (problem(status, "x", "y").headers or {})


def test_an_unexpected_error_is_a_generic_500_without_its_message() -> None:
    answer = problem_of(RuntimeError("SECRET-PAYLOAD"))
    assert isinstance(answer.extra, dict)
    assert (answer.status_code, answer.extra["code"]) == (500, "internal_error")
    assert "SECRET" not in json.dumps([answer.detail, answer.extra])


def test_openapi_document_is_served(http: TestClient[Any]) -> None:
    document = http.get("/schema/openapi.json").json()
    assert "/v1/responses" in document["paths"]
    assert "bearer" in document["components"]["securitySchemes"]
    assert http.get("/schema").json() == document


@pytest.mark.parametrize("viewer", ["redoc", "swagger", "elements", "rapidoc", "scalar"])
def test_no_documentation_viewer_runs_foreign_scripts_on_this_origin(
        http: TestClient[Any], viewer: str) -> None:
    """Litestar's viewers load unpinned scripts from public CDNs into pages of this origin,
    where they could act with an operator's console session."""
    assert http.get(f"/schema/{viewer}").status_code == 404
