"""No console page, form or asset answers 500, whatever a browser (or anyone) sends:
generated query strings, form bodies, path ids, cookies and CSRF tokens, on both stores.
A refused request also changes nothing: the task the forms aim at stays queued."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import TestClient

from core.states import Status
from core.store.database import Database
from tests.console.helpers import Console
from tests.store.helpers import new_task, task_row

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
text = st.text(max_size=80)
ids = st.one_of(text, st.from_regex(r"\A[a-z]{1,12}_[0-9a-z]{1,40}\Z")).map(
    lambda item: quote(item, safe=""))
FORMS = ["/console/login", "/console/logout", "/console/tasks/{id}/cancel",
         "/console/tasks/{id}/retry", "/console/schedules/{id}/delete",
         "/console/clients/{id}/revoke"]
PAGES = ["/console", "/console/tasks", "/console/tasks/{id}", "/console/dead-letters",
         "/console/schedules", "/console/clients", "/console/models", "/console/login",
         "/console/static/{id}"]


@FUZZ
@given(path=st.sampled_from(PAGES), item=ids,
       query=st.dictionaries(st.sampled_from(["status", "client", "model", "after", "x"]), text,
                             max_size=4))
def test_pages_never_fail_on_generated_queries(console: Console, path: str, item: str,
                                               query: dict[str, str]) -> None:
    answer = console.http.get(path.replace("{id}", item), params=query, follow_redirects=False)
    assert answer.status_code < 500, (path, query, answer.text[:300])


@FUZZ
@given(path=st.sampled_from(FORMS), item=ids,
       body=st.one_of(st.dictionaries(st.sampled_from(["csrf", "token", "x"]), text, max_size=3),
                      st.binary(max_size=200)),
       content_type=st.sampled_from(["application/x-www-form-urlencoded",
                                     "multipart/form-data; boundary=xyz", "text/plain"]))
def test_forms_never_fail_on_generated_bodies(console: Console, db: Database, model_id: str,
                                              path: str, item: str, body: Any,
                                              content_type: str) -> None:
    target = new_task(db, model_id)
    url = path.replace("{id}", item)
    if isinstance(body, dict):
        answer = console.http.post(url, data=body, follow_redirects=False)
    else:
        answer = console.http.post(url, content=body, headers={"Content-Type": content_type},
                                   follow_redirects=False)
    assert answer.status_code < 500, (path, body, answer.text[:300])
    assert task_row(db, target).status == Status.QUEUED


@FUZZ
@given(cookie=text, marker=st.sampled_from(["same-origin", "cross-site", "none", ""]))
def test_generated_session_cookies_open_nothing(http: TestClient[Any], cookie: str,
                                                marker: str) -> None:
    http.cookies.set("taskward_console", cookie.encode("ascii", "ignore").decode())
    page = http.get("/console", follow_redirects=False)
    assert page.status_code == 303
    api = http.get("/v1/tasks", headers={"Sec-Fetch-Site": marker} if marker else {})
    assert api.status_code == 401


@FUZZ
@given(path=st.sampled_from(FORMS), item=ids, value=st.binary(max_size=40),
       charset=st.sampled_from(["", "utf-8", "utf-16", "latin-1", "no-such-charset", "\u00e9"]))
def test_forms_never_fail_on_multipart_parts_their_charset_cannot_decode(
    console: Console, db: Database, model_id: str, path: str, item: str, value: bytes,
    charset: str,
) -> None:
    """A well-formed multipart body whose part is any bytes in any charset: at worst
    400 (bytes `\\xff` in UTF-8, or an unknown charset, escaped Litestar's parser)."""
    target = new_task(db, model_id)
    part_type = f"Content-Type: text/plain; charset={charset}\r\n".encode() if charset else b""
    for name in (b"token", b"csrf"):
        body = (b"--xyz\r\nContent-Disposition: form-data; name=\"" + name + b"\"\r\n"
                + part_type + b"\r\n" + value + b"\r\n--xyz--\r\n")
        answer = console.http.post(
            path.replace("{id}", item), content=body, follow_redirects=False,
            headers={"Content-Type": "multipart/form-data; boundary=xyz"})
        assert answer.status_code < 500, (path, body, answer.text[:300])
    assert task_row(db, target).status == Status.QUEUED
