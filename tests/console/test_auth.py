"""Console login, the session cookie, CSRF and the API's narrow use of the cookie
(docs/operations.md, Operator console). Both stores."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from litestar.testing import TestClient

from core.clients import IssuedToken
from core.settings import Settings
from core.states import Status
from core.store.clients import create_client, revoke
from core.store.database import Database
from infra.app import serving_app
from tests.console.helpers import SAME_ORIGIN, Console, running
from tests.store.helpers import new_task, task_row

PAGES = ["/console", "/console/tasks", "/console/dead-letters", "/console/schedules",
         "/console/clients", "/console/models"]


@pytest.mark.parametrize("path", PAGES)
def test_no_page_without_a_session(http: TestClient[Any], path: str) -> None:
    answer = http.get(path, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/login"


def test_login_sets_a_strict_http_only_session_cookie_without_the_token(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    answer = Console(http).login(admin.token)
    assert answer.status_code == 303 and answer.headers["location"] == "/console"
    cookie = answer.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower()
    assert "secure" not in attributes  # plain HTTP here; see the TLS test below
    assert admin.token not in cookie


def test_the_cookie_is_secure_when_the_console_is_reached_over_tls(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    answer = http.post("https://testserver.local/console/login", data={"token": admin.token},
                       follow_redirects=False)
    assert answer.status_code == 303
    assert "secure" in {p.strip().lower() for p in answer.headers["set-cookie"].split(";")}


def test_a_session_shorter_than_a_second_still_gets_a_cookie_the_browser_keeps(
    settings: Settings, admin: IssuedToken,
) -> None:
    """`Max-Age=0` (the hours' seconds truncated) would have the browser drop the cookie
    at once: the login would seem to work and land on the login form again."""
    with TestClient(serving_app(replace(settings, console_session_hours=0.0001))) as http:
        cookie = Console(http).login(admin.token).headers["set-cookie"]
    max_age = next(part.split("=")[1] for part in map(str.strip, cookie.split(";"))
                   if part.lower().startswith("max-age="))
    assert max_age == "1"


def test_the_token_never_appears_in_a_page(console: Console, admin: IssuedToken) -> None:
    for path in PAGES:
        assert admin.token not in console.page(path)


def test_login_is_refused_for_a_wrong_token(http: TestClient[Any]) -> None:
    answer = Console(http).login("tw_not-a-token")
    assert answer.status_code == 401
    assert "invalid_token" in answer.text and "set-cookie" not in answer.headers


def test_login_is_refused_for_a_client_without_admin(http: TestClient[Any], db: Database) -> None:
    reader = create_client(db, name="reader", scopes=frozenset({"tasks:read", "clients:admin"}))
    answer = Console(http).login(reader.token)
    assert answer.status_code == 403
    assert "admin_required" in answer.text and "set-cookie" not in answer.headers


def test_login_posted_from_another_site_is_refused(http: TestClient[Any],
                                                   admin: IssuedToken) -> None:
    answer = http.post("/console/login", data={"token": admin.token}, follow_redirects=False,
                       headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


# Behind a reverse proxy that rewrites `Host` (nginx's default sends the upstream's), the
# page's origin names the proxy while `Host` names taskward ("testserver.local" here).
PROXIED = {"Origin": "https://console.example.com"}


def test_login_behind_a_proxy_rewriting_host_is_accepted_when_the_browser_says_same_origin(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    answer = http.post("/console/login", data={"token": admin.token}, follow_redirects=False,
                       headers={**SAME_ORIGIN, **PROXIED})
    assert answer.status_code == 303 and "set-cookie" in answer.headers


def test_a_form_behind_a_proxy_rewriting_host_is_accepted_when_the_browser_says_same_origin(
    console: Console, db: Database, model_id: str,
) -> None:
    task_id = new_task(db, model_id)
    answer = console.http.post(f"/console/tasks/{task_id}/cancel", data={"csrf": console.csrf()},
                               follow_redirects=False, headers={**SAME_ORIGIN, **PROXIED})
    assert answer.status_code == 303
    assert task_row(db, task_id).status == Status.CANCELLED


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_login_marked_from_another_site_is_refused_behind_a_proxy(
    http: TestClient[Any], admin: IssuedToken, site: str,
) -> None:
    answer = http.post("/console/login", data={"token": admin.token}, follow_redirects=False,
                       headers={"Sec-Fetch-Site": site, **PROXIED})
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


def test_a_form_marked_cross_site_is_refused_behind_a_proxy(
    console: Console, db: Database, model_id: str,
) -> None:
    task_id = new_task(db, model_id)
    answer = console.http.post(f"/console/tasks/{task_id}/cancel", data={"csrf": console.csrf()},
                               follow_redirects=False,
                               headers={"Sec-Fetch-Site": "cross-site", **PROXIED})
    assert answer.status_code == 403 and "csrf_refused" in answer.text
    assert task_row(db, task_id).status == Status.QUEUED


def test_login_without_fetch_metadata_from_another_host_is_refused(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    """An older browser that sends no `Sec-Fetch-Site`: its `Origin` must name `Host`
    (docs/operations.md: behind a proxy, pass `Host` through for such browsers)."""
    answer = http.post("/console/login", data={"token": admin.token}, follow_redirects=False,
                       headers=PROXIED)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


@pytest.mark.parametrize("origin", ["http://[", "http://[::1", "http://a]b"])
def test_a_form_whose_origin_no_browser_sends_is_refused_not_failed(
    console: Console, db: Database, model_id: str, origin: str,
) -> None:
    """An `Origin` that is no URL (an unclosed bracket: a scanner's, not a browser's)
    is another origin's: 403 before anything is read, never a 500."""
    task_id = running(db, model_id)
    answer = console.http.post(f"/console/tasks/{task_id}/cancel",
                               data={"csrf": console.csrf()}, follow_redirects=False,
                               headers={"Origin": origin})
    assert answer.status_code == 403 and "csrf_refused" in answer.text
    assert "running" in console.page(f"/console/tasks/{task_id}")
    login = console.http.post("/console/login", data={"token": "tw_x"}, follow_redirects=False,
                              headers={"Origin": origin})
    assert login.status_code == 403 and "set-cookie" not in login.headers


def test_a_same_origin_form_still_needs_its_csrf_token(console: Console, db: Database,
                                                       model_id: str) -> None:
    task_id = new_task(db, model_id)
    answer = console.http.post(f"/console/tasks/{task_id}/cancel", data={"csrf": "0" * 64},
                               follow_redirects=False, headers={**SAME_ORIGIN, **PROXIED})
    assert answer.status_code == 403
    assert task_row(db, task_id).status == Status.QUEUED


def test_a_form_without_the_csrf_token_changes_nothing(console: Console, db: Database,
                                                       model_id: str) -> None:
    task_id = running(db, model_id)
    for csrf in ("", "0" * 64):
        answer = console.act(f"/console/tasks/{task_id}/cancel", csrf=csrf)
        assert answer.status_code == 403 and "csrf_refused" in answer.text
    assert "running" in console.page(f"/console/tasks/{task_id}")


def test_a_form_from_another_origin_is_refused_even_with_the_token(
    console: Console, db: Database, model_id: str,
) -> None:
    task_id = running(db, model_id)
    answer = console.http.post(f"/console/tasks/{task_id}/cancel",
                               data={"csrf": console.csrf()}, follow_redirects=False,
                               headers={"Origin": "http://elsewhere.example"})
    assert answer.status_code == 403


def test_logout_ends_the_session_even_for_a_copy_of_the_cookie(console: Console) -> None:
    copied = dict(console.http.cookies)
    assert console.act("/console/logout").status_code == 303
    assert console.http.get("/console", follow_redirects=False).status_code == 303
    console.http.cookies.update(copied)
    assert console.http.get("/console", follow_redirects=False).status_code == 303


def test_a_revoked_clients_sessions_end(console: Console, db: Database,
                                        admin: IssuedToken) -> None:
    console.page("/console")
    revoke(db, admin.client_id)
    assert console.http.get("/console", follow_redirects=False).status_code == 303


def test_the_api_reads_a_task_with_the_cookie_only_from_a_same_origin_page(
    console: Console, db: Database, model_id: str,
) -> None:
    task_id = running(db, model_id)
    events = f"/v1/tasks/{task_id}/events"
    assert console.http.get(events, headers=SAME_ORIGIN).status_code == 200
    assert console.http.get(events).status_code == 401  # no marker: a script elsewhere
    cross = {"Sec-Fetch-Site": "cross-site"}
    assert console.http.get(events, headers=cross).status_code == 401


def test_the_api_never_changes_state_on_the_cookie(console: Console, db: Database,
                                                   model_id: str) -> None:
    task_id = running(db, model_id)
    answer = console.http.post(f"/v1/tasks/{task_id}/cancel", headers=SAME_ORIGIN)
    assert answer.status_code == 401
    assert "running" in console.page(f"/console/tasks/{task_id}")


def test_the_sse_route_streams_to_a_console_session(console: Console, db: Database,
                                                    model_id: str) -> None:
    task_id = new_task(db, model_id)
    console.act(f"/console/tasks/{task_id}/cancel")  # queued -> cancelled: the log ends
    answer = console.http.get(f"/v1/tasks/{task_id}/events",
                              headers={**SAME_ORIGIN, "Accept": "text/event-stream"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "event: response.cancelled" in answer.text


def test_pages_forbid_foreign_scripts_and_framing(console: Console) -> None:
    answer = console.http.get("/console")
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert answer.headers["cache-control"] == "no-store"
