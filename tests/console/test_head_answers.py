"""HEAD on the console's pages and assets answers as GET does, without a body: the same
status and headers (Content-Type and Content-Length of GET's body included), the same
login redirect without a session, the same error pages, and nothing changed."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient
from sqlalchemy import func, select

from core.store.database import Database
from core.tables import console_sessions
from handlers.console.render import ASSETS, asset_url
from tests.console.helpers import Console
from tests.store.helpers import new_task

PAGES = ["/console", "/console/", "/console/tasks", "/console/tasks?status=queued",
         "/console/tasks/{id}", "/console/dead-letters", "/console/schedules",
         "/console/clients", "/console/models", "/console/login"]


def _same_but_body(got: Any, head: Any) -> None:
    assert head.status_code == got.status_code
    assert head.content == b""
    assert dict(head.headers) == dict(got.headers)


@pytest.mark.parametrize("path", PAGES)
def test_head_of_a_page_answers_as_get_without_the_body(
    console: Console, db: Database, model_id: str, path: str,
) -> None:
    path = path.replace("{id}", new_task(db, model_id))
    got = console.http.get(path, follow_redirects=False)
    head = console.http.head(path, follow_redirects=False)
    assert got.status_code == 200 and got.content
    _same_but_body(got, head)
    assert head.headers["content-type"] == "text/html; charset=utf-8"
    assert head.headers["content-length"] == str(len(got.content))


@pytest.mark.parametrize("name", ASSETS)
def test_head_of_an_asset_answers_as_get_without_the_body(http: TestClient[Any],
                                                          name: str) -> None:
    got = http.get(asset_url(name))
    head = http.head(asset_url(name))
    assert got.status_code == 200
    _same_but_body(got, head)
    assert int(head.headers["content-length"]) == len(got.content) > 0


@pytest.mark.parametrize("path", ["/console", "/console/tasks", "/console/models"])
def test_head_without_a_session_is_sent_to_the_login_as_get_is(http: TestClient[Any],
                                                               path: str) -> None:
    got = http.get(path, follow_redirects=False)
    head = http.head(path, follow_redirects=False)
    assert got.status_code == 303 and got.headers["location"] == "/console/login"
    _same_but_body(got, head)


@pytest.mark.parametrize("path", ["/console/tasks/task_nope", "/console/tasks?status=nope",
                                  "/console/static/nope.js"])
def test_head_of_a_failure_is_the_same_failure(console: Console, path: str) -> None:
    got = console.http.get(path, follow_redirects=False)
    head = console.http.head(path, follow_redirects=False)
    assert got.status_code in (404, 422)
    assert (head.status_code, head.headers["content-type"]) == (
        got.status_code, got.headers["content-type"])
    assert head.content == b""


def test_head_changes_nothing(console: Console, db: Database, model_id: str) -> None:
    task_id = new_task(db, model_id)
    before = console.http.get(f"/console/tasks/{task_id}").text
    with db.read() as conn:
        sessions = conn.execute(select(func.count()).select_from(console_sessions)).scalar()
    for path in PAGES:
        assert console.http.head(path.replace("{id}", task_id)).status_code == 200
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(console_sessions)).scalar() \
            == sessions
    assert "set-cookie" not in console.http.head("/console/login").headers
    assert console.http.get(f"/console/tasks/{task_id}").text.count(task_id) \
        == before.count(task_id)


@pytest.mark.parametrize("path", ["/console", "/console/tasks", "/console/tasks/task_x",
                                  "/console/static/console.css", "/console/login"])
def test_options_lists_head_with_get(http: TestClient[Any], path: str) -> None:
    allowed = http.options(path).headers["allow"].split(", ")
    assert "GET" in allowed and "HEAD" in allowed
