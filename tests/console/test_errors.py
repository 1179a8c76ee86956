"""A path the console does not have, or a method its path does not take, is a console
page with the pages' security headers, not a problem document; outside `/console` the
API's answers stay problem documents (docs/operations.md, Operator console)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from core.store.database import Database
from tests.console.helpers import Console
from tests.store.helpers import new_task

PROBLEM = "application/problem+json"


def _is_console_page(answer: httpx.Response) -> bool:
    return (answer.headers["content-type"].startswith("text/html")
            and "script-src 'self'" in answer.headers["content-security-policy"]
            and answer.headers["x-frame-options"] == "DENY")


@pytest.mark.parametrize("path", ["/console/nope", "/console/tasks/x/y",
                                  "/console/static/..%2fhandlers%2fconsole%2fpages.py",
                                  "/console/clients/cli_x", "/console/tasks/resp_x/cancel/z"])
def test_a_path_the_console_does_not_have_is_a_404_page(console: Console, path: str) -> None:
    answer = console.http.get(path, follow_redirects=False)
    assert answer.status_code == 404
    assert _is_console_page(answer)


def test_a_404_page_is_served_without_a_session(http: TestClient[Any]) -> None:
    answer = http.get("/console/nope", follow_redirects=False)
    assert answer.status_code == 404 and _is_console_page(answer)


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/console/logout", "POST"),
    ("GET", "/console/tasks/{id}/cancel", "POST"),
    ("PUT", "/console/login", "GET"),
    ("DELETE", "/console/tasks/{id}", "GET"),
])
def test_a_method_the_path_does_not_take_is_a_405_page_with_allow(
    console: Console, db: Database, model_id: str, method: str, path: str, allowed: str,
) -> None:
    answer = console.http.request(method, path.replace("{id}", new_task(db, model_id)),
                                  follow_redirects=False)
    assert answer.status_code == 405
    assert _is_console_page(answer)
    assert allowed in answer.headers["allow"]


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/nope", 404),
    ("GET", "/consolex", 404),
    ("DELETE", "/v1/tasks", 405),
])
def test_outside_the_console_routing_failures_stay_problem_documents(
    console: Console, method: str, path: str, status: int,
) -> None:
    answer = console.http.request(method, path, follow_redirects=False)
    assert answer.status_code == status
    assert answer.headers["content-type"] == PROBLEM
    assert "content-security-policy" not in answer.headers
    if status == 405:
        assert "GET" in answer.headers["allow"]


def test_a_path_that_only_begins_like_the_consoles_is_the_apis_404(console: Console) -> None:
    near = console.http.get("/consolex")
    elsewhere = console.http.get("/nowhere")
    assert (near.status_code, near.json()) == (elsewhere.status_code, elsewhere.json())
    assert near.headers == elsewhere.headers
