"""Hostile input cannot break, stall or see into the API (docs/operations.md, robustness).

Each test is one class of input, tried on every route it concerns, on both stores.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

import pytest
from litestar.testing import TestClient
from sqlalchemy import event, update

from core.settings import Settings
from core.store.clients import revoke
from core.store.database import Database
from core.tables import tasks
from tests.api.helpers import Caller, caller, complete_due, start_due
from tests.api.test_errors import assert_problem

EDGE_DATES = [
    "9999-12-31T23:59:59-01:00",  # year 10000 once in UTC
    "9999-12-31T23:59:59.999-00:01",
    "0001-01-01T00:00:00+01:00",  # year 0 once in UTC
    "0001-01-01T00:30:00+00:31",
]


def create(who: Caller, model_id: str, **fields: Any) -> Any:
    return who.post("/v1/responses", json={"model": model_id, "input": "words=3", **fields})


@pytest.mark.parametrize("run_at", EDGE_DATES)
def test_a_date_beyond_the_calendar_in_utc_is_refused_at_parse_time(
    alice: Caller, model_id: str, run_at: str
) -> None:
    body = assert_problem(create(alice, model_id, run_at=run_at), 422, "validation_error")
    assert body["field"] == "run_at"
    assert alice.get("/v1/tasks").json()["data"] == []


def test_the_last_instant_of_the_calendar_is_accepted_and_readable(
    alice: Caller, admin: Caller, model_id: str
) -> None:
    created = create(alice, model_id, run_at="9999-12-31T23:59:59.999+00:00")
    assert created.status_code == 202
    task = alice.get(f"/v1/tasks/{created.json()['id']}").json()
    assert task["run_at"] == "9999-12-31T23:59:59.999Z"


def test_no_stored_time_can_break_a_read(
    alice: Caller, admin: Caller, model_id: str, db: Database
) -> None:
    low, high = (create(alice, model_id).json()["id"] for _ in range(2))
    with db.write() as conn:  # values no input can store any more, as an old row might
        conn.execute(update(tasks).where(tasks.c.id == high).values(run_at=2**62))
        conn.execute(update(tasks).where(tasks.c.id == low).values(run_at=-2**62))
    for who in (alice, admin):
        assert who.get("/v1/tasks").status_code == 200
        assert who.get(f"/v1/tasks/{high}").json()["run_at"] == "9999-12-31T23:59:59.999Z"
        assert who.get(f"/v1/tasks/{low}").json()["run_at"] == "0001-01-01T00:00:00.000Z"
    assert alice.post(f"/v1/tasks/{high}/cancel").status_code == 200
    assert alice.get(f"/v1/responses/{low}").status_code == 200


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def json_routes(admin: Caller, model_id: str) -> list[tuple[str, str]]:
    """Every route that reads a JSON body (a schedule is made for the PATCH)."""
    schedule = admin.post("/v1/schedules", json={
        "cron": "0 0 * * *", "request": {"model": model_id, "input": "hi"}}).json()["id"]
    return [("POST", "/v1/pair"), ("POST", "/v1/pairing-codes"), ("POST", "/v1/models"),
            ("POST", "/v1/responses"), ("POST", "/v1/schedules"),
            ("PATCH", f"/v1/schedules/{schedule}")]


@pytest.mark.parametrize("body", [
    deep(4000),  # 8000 bytes: within POST /v1/pair's limit
    b'{"model": "words", "input": "x", "metadata": {"k": ' + deep(2000) + b"}}",
    b'{"cron": "* * * * *", "request": ' + b'{"a": ' * 100 + b"1" + b"}" * 100 + b"}",
], ids=["array", "inside-an-object", "objects"])
def test_nesting_thousands_deep_is_a_400_on_every_json_route(
    admin: Caller, model_id: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    for method, path in json_routes(admin, model_id):
        answer = admin.request(method, path, content=body,
                               headers={"Content-Type": "application/json"})
        assert_problem(answer, 400, "json_too_deep")
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


def test_a_deep_body_is_refused_before_authentication_matters(http: TestClient[Any]) -> None:
    answer = http.post("/v1/pair", content=deep(4000),
                       headers={"Content-Type": "application/json"})
    assert_problem(answer, 400, "json_too_deep")


ODD_IDS = ["garbage", "task_0", "resp_%00", "x" * 3000, "%F0%9F%98%80", "resp_..", "a%20b",
           "UPPER_CASE", "cli_", "_x", "%FF%FE"]


def id_routes(odd: str) -> list[tuple[str, str, str]]:
    return [
        ("GET", f"/v1/tasks/{odd}", "task_not_found"),
        ("POST", f"/v1/tasks/{odd}/cancel", "task_not_found"),
        ("GET", f"/v1/tasks/{odd}/events", "task_not_found"),
        ("POST", f"/v1/tasks/{odd}/retry", "task_not_found"),
        ("GET", f"/v1/responses/{odd}", "task_not_found"),
        ("GET", f"/v1/responses/{odd}?stream=true", "task_not_found"),
        ("POST", f"/v1/responses/{odd}/cancel", "task_not_found"),
        ("DELETE", f"/v1/responses/{odd}", "task_not_found"),
        ("DELETE", f"/v1/clients/{odd}", "client_not_found"),
        ("GET", f"/v1/models/{odd}", "model_not_found"),
        ("DELETE", f"/v1/models/{odd}", "model_not_found"),
        ("GET", f"/v1/schedules/{odd}", "schedule_not_found"),
        ("PATCH", f"/v1/schedules/{odd}", "schedule_not_found"),
        ("DELETE", f"/v1/schedules/{odd}", "schedule_not_found"),
    ]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_an_id_of_any_shape_that_names_nothing_is_404(admin: Caller, odd: str) -> None:
    for method, path, code in id_routes(odd):
        extra = {"json": {"catch_up": 2}} if method == "PATCH" else {}
        assert_problem(admin.request(method, path, **extra), 404, code)


@pytest.mark.parametrize(("field", "value"), [
    ("max_output_tokens", "5"), ("stream", "yes"), ("background", 0), ("seed", 1.5),
    ("temperature", "0.5"), ("max_attempts", True), ("input", 5), ("metadata", {"k": 1}),
    ("run_at", 1_700_000_000),
])
def test_json_types_are_strict_on_responses(
    alice: Caller, model_id: str, field: str, value: Any
) -> None:
    body = assert_problem(create(alice, model_id, **{field: value}), 422, "validation_error")
    assert body["field"].startswith(field)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/schedules", {"cron": "0 0 * * *", "catch_up": "2", "request": {"input": "x"}}),
    ("/v1/schedules", {"cron": "0 0 * * *", "request": {"model": "words", "input": "x",
                                                        "max_output_tokens": "5"}}),
    ("/v1/pairing-codes", {"scopes": "tasks:read"}),
    ("/v1/models", {"path": "words.bin", "id": 5}),
    ("/v1/pair", {"code": 12345}),
])
def test_json_types_are_strict_on_every_body(
    admin: Caller, model_id: str, path: str, body: dict[str, Any]
) -> None:
    assert_problem(admin.post(path, json=body), 422, "validation_error")


def test_problem_details_bound_and_sanitise_the_field_names_they_repeat(
    alice: Caller, model_id: str
) -> None:
    hostile = "<script>alert(1)</script>\u202e" + "k" * 500
    for body in ({"model": model_id, "input": "x", hostile: 1},
                 {"model": model_id, "input": "x", "metadata": {hostile: "v"}}):
        problem = assert_problem(alice.post("/v1/responses", json=body), 422,
                                 "validation_error")
        shown = problem["detail"] + str(problem.get("errors")) + problem["field"]
        assert "<script>" not in shown and "\u202e" not in shown and "k" * 100 not in shown


@pytest.mark.parametrize("model", ["/leading", "trailing/", "two//slashes", "a/"])
def test_model_ids_with_empty_segments_are_refused(
    db: Database, http: TestClient[Any], settings: Settings, model: str
) -> None:
    (settings.models_dir / "m.bin").write_bytes(b"weights")
    admin = caller(db, http, "models:admin", "models:read")
    answer = admin.post("/v1/models", json={"path": "m.bin", "id": model, "engine": "test.words"})
    assert_problem(answer, 422, "invalid_model_id")
    assert admin.get("/v1/models").json()["data"] == []


def test_a_model_id_with_a_slash_inside_is_reachable(
    db: Database, http: TestClient[Any], settings: Settings
) -> None:
    (settings.models_dir / "m.bin").write_bytes(b"weights")
    admin = caller(db, http, "models:admin", "models:read")
    assert admin.post("/v1/models", json={"path": "m.bin", "id": "org/m",
                                          "engine": "test.words"}).status_code == 201
    assert admin.get("/v1/models/org/m").json()["id"] == "org/m"
    # An encoded slash names it too: the one place under /v1 where it is not refused.
    assert admin.get("/v1/models/org%2Fm").json()["id"] == "org/m"
    assert admin.delete("/v1/models/org/m").status_code == 204


def test_an_unknown_engine_is_refused_at_registration(
    db: Database, http: TestClient[Any], settings: Settings
) -> None:
    (settings.models_dir / "m.bin").write_bytes(b"weights")
    admin = caller(db, http, "models:admin", "models:read")
    answer = admin.post("/v1/models", json={"path": "m.bin", "engine": "no-such-engine"})
    problem = assert_problem(answer, 422, "unknown_engine")
    assert problem["field"] == "engine"
    # It names what the operator may choose from, the test's plug-in engines included.
    assert "installed: " in problem["detail"] and "llama.cpp" in problem["detail"]
    assert "openai" in problem["detail"]


def test_only_an_admin_may_revoke_an_admin(
    db: Database, http: TestClient[Any], admin: Caller
) -> None:
    clients_admin = caller(db, http, "clients:admin")
    assert_problem(clients_admin.delete(f"/v1/clients/{admin.id}"), 403, "admin_required")
    assert admin.get("/v1/clients").status_code == 200  # not locked out
    other = caller(db, http, "tasks:read")
    assert clients_admin.delete(f"/v1/clients/{other.id}").status_code == 204
    second_admin = caller(db, http, "admin")
    assert admin.delete(f"/v1/clients/{second_admin.id}").status_code == 204


@pytest.mark.parametrize("path", ["/v1/tasks/{}/events", "/v1/responses/{}?stream=true"])
def test_a_revoked_clients_stream_ends(
    db: Database, http: TestClient[Any], model_id: str, path: str
) -> None:
    watcher = caller(db, http, "responses:create", "tasks:read")
    task_id = create(watcher, model_id).json()["id"]
    start_due(db)  # running, so its log stays open until the client goes
    # The test client answers once the stream has ended: revoke from beside it, as an
    # operator would (`taskward clients revoke`), while the stream is open.
    threading.Timer(1.0, revoke, args=(db, watcher.id)).start()
    started = time.monotonic()
    answer = watcher.get(path.format(task_id), headers={"Accept": "text/event-stream"},
                         timeout=30)
    assert answer.status_code == 200 and "response.in_progress" in answer.text
    assert time.monotonic() - started < 10


def statements_of(http: TestClient[Any]) -> list[str]:
    """Every SQL statement the app's own engine sends from now on."""
    seen: list[str] = []
    event.listen(http.app.state.services.db.engine, "before_cursor_execute",
                 lambda _c, _cur, statement, *_: seen.append(statement))
    return seen


def test_task_lists_and_reads_do_not_select_stored_requests(
    alice: Caller, admin: Caller, http: TestClient[Any], model_id: str, db: Database
) -> None:
    ids = [create(alice, model_id, instructions="big " * 10_000).json()["id"] for _ in range(3)]
    complete_due(db)
    seen = statements_of(http)
    for path in ("/v1/tasks?limit=100", f"/v1/tasks/{ids[0]}", "/v1/dead-letters"):
        who = admin if "dead" in path else alice
        assert who.get(path).status_code == 200
    reads = [s for s in seen if re.search(r"\bFROM tasks\b", s)]
    assert reads
    for statement in reads:
        assert not re.search(r"tasks\.(request|snapshot)\b", statement), statement
        assert "output_text" not in statement, statement


def test_lifecycle_events_carry_the_instructions_once(
    alice: Caller, model_id: str, db: Database
) -> None:
    task_id = create(alice, model_id, instructions="I" * 50_000).json()["id"]
    complete_due(db)
    page = alice.get(f"/v1/tasks/{task_id}/events").json()["data"]
    lifecycle = [e for e in page if "response" in e["data"]]
    assert len(lifecycle) >= 3
    assert [e["type"] for e in lifecycle if e["data"]["response"]["instructions"]] == [
        "response.created"]
    assert alice.get(f"/v1/responses/{task_id}").json()["instructions"] == "I" * 50_000


@pytest.mark.parametrize(("kind", "code"), [
    ("loop", "model_file_unreadable"), ("fifo", "model_file_missing"),
    ("directory", "model_file_missing"), ("dangling", "model_file_missing"),
])
def test_registering_what_is_not_a_regular_file_is_a_clean_422(
    db: Database, http: TestClient[Any], settings: Settings, kind: str, code: str
) -> None:
    path = settings.models_dir / "odd.gguf"
    if kind == "loop":
        path.symlink_to(settings.models_dir / "odd2.gguf")
        (settings.models_dir / "odd2.gguf").symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(settings.models_dir / "gone.gguf")
    admin = caller(db, http, "models:admin")
    answer = admin.post("/v1/models", json={"path": "odd.gguf", "engine": "test.words"},
                        timeout=10)
    assert assert_problem(answer, 422, code)["field"] == "path"
