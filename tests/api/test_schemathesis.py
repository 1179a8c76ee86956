"""Generated and hostile requests over the served OpenAPI document: no input produces a 5xx.

Every operation of the app (the test checks that the document lists every route) gets
valid and invalid inputs (schemathesis, positive and negative modes, a bounded number of
examples each) against `taskward serve` on both stores, sent with an admin token so that
requests get past authentication to the handlers. Half of the generated cases have
their path ids replaced by ids that exist (a task, a schedule, a spare model and a
spare client), so handlers are exercised past their not-found answers. Each operation
then gets the same hand-made hostile requests: deep nesting, strings for numbers,
calendar-edge dates, NUL bytes and ids of every shape.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from core.settings import Settings
from infra.app import serving_app
from tests.api.helpers import MODEL_FILE
from tests.api.served import Service

EXAMPLES_PER_OPERATION = 12
HOSTILE_BODIES: list[bytes] = [
    b"[" * 5000 + b"]" * 5000,
    b'{"model": "words", "input": "x", "metadata": {"k": ' + b"[" * 3000 + b"]" * 3000 + b"}}",
    b'{"model": "words", "input": "x", "max_output_tokens": "5", "stream": "yes"}',
    b'{"model": "words", "input": "x", "run_at": "9999-12-31T23:59:59-01:00"}',
    b'{"model": "words", "input": "x", "run_at": "0001-01-01T00:00:00+01:00"}',
    b'{"model": "words\\u0000", "input": "\\u0000", "metadata": {"\\u0000": "\\u0000"}}',
    b'{"cron": "* * * * *", "catch_up": 1e308, "request": {"model": "words", "input": "x"}}',
    b'{"code": "pc_aaaaaaaaaaaaaaaaaaaa-x", "name": 99999999999999999999999999}',
    b'{"path": "../../etc/passwd", "id": "/x/", "engine": "nope"}',
    b"\xff\xfe not utf-8",
]
HOSTILE_IDS = ["garbage", "%00", "x" * 2000, "%F0%9F%98%80"]


def app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """(method, path) of every API route the app serves, as OpenAPI spells the path.
    The console's HTML pages are not in the API document; tests/console/test_fuzz.py
    fuzzes them."""
    app = serving_app(Settings(database_url=f"sqlite:///{tmp_path}/routes.db"))
    return {(method, route.path.replace(":str", "").replace(":path", ""))
            for route in app.routes for method in getattr(route, "methods", ())
            if method != "OPTIONS"
            and not route.path.startswith(("/schema", "/console"))}


def real_ids(service: Service, auth: dict[str, str]) -> dict[str, str]:
    """Ids that name something, by path parameter name."""
    task = requests.post(f"{service.base_url}/v1/responses", headers=auth, timeout=30,
                         json={"model": "words", "input": "words=2"}).json()["id"]
    schedule = requests.post(f"{service.base_url}/v1/schedules", headers=auth, timeout=30,
                             json={"cron": "0 0 * * *",
                                   "request": {"model": "words", "input": "x"}}).json()["id"]
    spare_client: Any = service.cli_json("pair", "--token", "--scopes", "tasks:read")
    models_dir = Path(service.env["TASKWARD_MODELS_DIR"])
    service.cli("models", "add", str(models_dir / MODEL_FILE), "--id", "spare",
                "--engine", "test.words")
    return {"task_id": task, "response_id": task, "schedule_id": schedule,
            "client_id": spare_client["client_id"], "model_id": "spare"}


def test_no_generated_or_hostile_request_gets_a_server_error(
    service: Service, tmp_path: Path
) -> None:
    auth = {"Authorization": f"Bearer {service.admin_token()}"}
    schema = schemathesis.openapi.from_url(f"{service.base_url}/schema/openapi.json")
    failures: list[str] = []
    statuses: dict[int, int] = {}
    session = requests.Session()
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operations.append(result.ok())
    assert {(op.method.upper(), op.path) for op in operations} == app_routes(tmp_path)
    known = real_ids(service, auth)
    flip = itertools.cycle([True, False])

    def record(label: str, response: requests.Response) -> None:
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500:
            failures.append(f"{label} -> {response.status_code}: {response.text[:200]}")

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def call(case: Any) -> None:
                if case.path_parameters and next(flip):
                    case.path_parameters = {name: known.get(name, value)
                                            for name, value in case.path_parameters.items()}
                response = case.call(base_url=service.base_url, session=session,
                                     headers=auth, timeout=30)
                record(f"{case.method} {case.formatted_path}", response)

            call()
        for method, path, body in hostile_requests(operation.method.upper(), operation.path,
                                                   known):
            response = session.request(method, f"{service.base_url}{path}", data=body,
                                       headers={**auth, "Content-Type": "application/json"},
                                       timeout=30)
            record(f"{method} {path[:80]} (hostile)", response)
    assert failures == []
    assert sum(statuses.values()) >= 2 * len(operations)
    assert statuses.keys() & {200, 201, 202, 204}  # some requests did get through


def hostile_requests(
    method: str, path: str, known: dict[str, str]
) -> list[tuple[str, str, bytes | None]]:
    """The hand-made requests for one operation: every odd id in each path parameter,
    and, where it takes a body, every hostile body on a path of ids that exist."""
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    odd: list[tuple[str, str, bytes | None]] = [(method, path.replace("{" + name + "}", text), None)
           for name in names for text in HOSTILE_IDS]
    if method not in {"POST", "PATCH"}:
        return odd
    real = path
    for name in names:
        real = real.replace("{" + name + "}", known[name])
    return odd + [(method, real, body) for body in HOSTILE_BODIES]
