"""Under `/schema` only the OpenAPI document is served; any other path there is the
same problem `404` as every path nothing serves, not Litestar's HTML page."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.api.test_errors import assert_problem


@pytest.mark.parametrize("path", ["/schema/swagger", "/schema/anything", "/schema/x.yaml",
                                  "/schema/openapi.json/more"])
def test_an_unknown_path_under_schema_is_the_problem_404(
    http: TestClient[Any], path: str
) -> None:
    problem = assert_problem(http.get(path), 404, "not_found")
    elsewhere = assert_problem(http.get("/v1/nothing-here"), 404, "not_found")
    assert problem.keys() == elsewhere.keys()
    assert (problem["title"], problem["detail"]) == (elsewhere["title"], elsewhere["detail"])


def test_the_document_is_still_served_at_both_paths(http: TestClient[Any]) -> None:
    document = http.get("/schema/openapi.json")
    assert document.status_code == 200 and "/v1/responses" in document.json()["paths"]
    assert http.get("/schema").json() == document.json()
