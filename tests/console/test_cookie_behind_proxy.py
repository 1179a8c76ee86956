"""Behind a TLS-terminating proxy taskward sees plain HTTP: the session cookie is still
`Secure` when the proxy says `X-Forwarded-Proto: https`, on login and on logout
(docs/operations.md, Operator console). Both stores."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from core.clients import IssuedToken
from tests.console.helpers import Console

HTTPS = {"X-Forwarded-Proto": "https"}


def attributes(answer: httpx.Response) -> set[str]:
    return {part.strip().split("=")[0].lower() for part in answer.headers["set-cookie"].split(";")}


@pytest.mark.parametrize("proto", ["https", "HTTPS", "https, http"])
def test_login_behind_a_proxy_that_says_https_sets_a_secure_cookie(
    http: TestClient[Any], admin: IssuedToken, proto: str,
) -> None:
    answer = http.post("/console/login", data={"token": admin.token},
                       headers={"X-Forwarded-Proto": proto}, follow_redirects=False)
    assert answer.status_code == 303
    assert "secure" in attributes(answer)


def test_login_behind_a_proxy_that_says_http_leaves_secure_off(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    answer = http.post("/console/login", data={"token": admin.token},
                       headers={"X-Forwarded-Proto": "http"}, follow_redirects=False)
    assert answer.status_code == 303
    assert "secure" not in attributes(answer)


def test_logout_behind_a_proxy_that_says_https_clears_a_secure_cookie(
    http: TestClient[Any], admin: IssuedToken,
) -> None:
    console = Console(http)
    assert console.login(admin.token).status_code == 303
    answer = http.post("/console/logout", data={"csrf": console.csrf()}, headers=HTTPS,
                       follow_redirects=False)
    assert answer.status_code == 303
    assert {"secure", "max-age"} <= attributes(answer)
    assert "max-age=0" in answer.headers["set-cookie"].lower()
