"""`OPTIONS` on a path lists every method the path serves, as its `405` does.

Litestar kept the `OPTIONS` answer it made for a path's first handler: `OPTIONS
/v1/pairing-codes` said `OPTIONS, POST`, where a `PUT` there was told `GET, POST,
OPTIONS`.
"""

from __future__ import annotations

import re
from typing import Any

from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from core.ids import random_id

# A value of each path parameter the app's routes have, of the shape its route accepts
# (an id that could not be one is a 404 before any method is looked at).
SAMPLES = {"task_id": random_id("resp"), "response_id": random_id("resp"),
           "client_id": random_id("cli"), "schedule_id": random_id("sch"),
           "code_id": "pc_" + "a" * 20, "model_id": "org/words", "name": "console.css",
           "path": "openapi.json"}
UNSERVED = ["PUT", "PATCH", "DELETE", "POST", "GET"]  # one a path lacks draws its 405
_PARAMETER = re.compile(r"\{(\w+)(?::\w+)?\}")


def concrete(route: HTTPRoute) -> str:
    return _PARAMETER.sub(lambda found: SAMPLES[found[1]], route.path)


def allowed(answer: Any) -> set[str]:
    return {method.strip() for method in answer.headers["allow"].split(",")}


def test_options_lists_the_methods_a_405_lists_on_every_path(http: TestClient[Any]) -> None:
    """Every API and console path; `/schema`'s are the document's alone (any other
    answer there is a 404), but an `OPTIONS` answered there lists all the same."""
    told: dict[str, tuple[set[str], set[str]]] = {}
    for route in http.app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        path = concrete(route)
        unserved = next(method for method in UNSERVED if method not in route.methods)
        refused = http.request(unserved, path)
        options = http.options(path)
        assert refused.status_code == 405, path
        if options.status_code != 204 and route.path.startswith("/schema"):
            continue
        assert options.status_code == 204, path
        told[route.path] = (allowed(options), allowed(refused))
    assert {"/v1/pairing-codes", "/console/login"} <= told.keys()
    assert {path: said for path, said in told.items() if said[0] != said[1]} == {}


def test_options_names_every_handler_of_a_shared_path(http: TestClient[Any]) -> None:
    assert allowed(http.options("/v1/pairing-codes")) == {"GET", "POST", "OPTIONS"}
