"""The probes and /metrics answer HEAD with GET's status and headers, Content-Length of
GET's body included (their HEAD handlers once said `Content-Length: 0`, or `4`)."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_head_answers_gets_headers_without_its_body(http: TestClient[Any], path: str) -> None:
    got = http.get(path)
    head = http.head(path)
    assert got.status_code == head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))
