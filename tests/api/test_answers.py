"""`handlers.answers.json_bytes` sends what Litestar's own `Response` would, byte for byte."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litestar import Response
from litestar.enums import MediaType

from handlers.answers import json_bytes

BODY = b'{"id":"resp_1","status":"queued","note":"\xc3\xa9"}'


def _messages(response: Any, **route: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        raise AssertionError("an answer reads nothing")

    asgi = response.to_asgi_response(None, None, **route)
    asyncio.run(asgi({"type": "http"}, receive, send))
    return sent


@pytest.mark.parametrize("headers", [
    None, {}, {"Location": "/v1/tasks/resp_1"},
    {"Location": "/v1/tasks/resp_1", "Idempotent-Replayed": "true",
     "Preference-Applied": "respond-async"},
    {"Dedupe-Hit": "true"},
])
@pytest.mark.parametrize("status", [200, 202])
def test_the_messages_are_litestars(headers: dict[str, str] | None, status: int) -> None:
    # What Litestar's route passes for a route without headers or cookies of its own.
    route: dict[str, Any] = {"headers": {}, "cookies": [], "background": None,
                             "media_type": "application/json",
                             "status_code": 202, "type_encoders": None}
    litestars = Response(BODY, status_code=status, media_type=MediaType.JSON, headers=headers)
    assert _messages(json_bytes(BODY, status, headers), **route) == _messages(litestars, **route)


def test_what_the_route_adds_goes_litestars_way() -> None:
    route: dict[str, Any] = {"headers": {"X-Route": "1"}, "cookies": [],
                             "media_type": "application/json"}
    [start, _body] = _messages(json_bytes(BODY, 202, {"Location": "/x"}), **route)
    assert (b"x-route", b"1") in start["headers"]
