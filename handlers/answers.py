"""Answer shapes shared by the route modules: lists, and JSON bodies kept as bytes."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.enums import MediaType
from litestar.types import ASGIApp, Receive, Scope, Send


def page(data: list[dict[str, Any]], next_cursor: str | None) -> dict[str, Any]:
    """The list object of docs/http-api.md: `{"object": "list", "data", "next_cursor"}`."""
    return {"object": "list", "data": data, "next_cursor": next_cursor}


def task_location(task_id: str) -> dict[str, str]:
    """The status monitor of a task: where a 202 points."""
    return {"Location": f"/v1/tasks/{task_id}"}


def json_bytes(body: bytes, status: int, headers: dict[str, str] | None = None) -> Response[bytes]:
    """A stored JSON body sent byte for byte (idempotent replays must be identical)."""
    return _StoredJson(body, status_code=status, media_type=MediaType.JSON, headers=headers)


class _StoredJson(Response[bytes]):
    """A `Response` of bytes already rendered, sent without Litestar's `ASGIResponse`:
    that builds a header structure per answer (lowercasing, encoding, a search per
    default header), a tenth of the HTTP layer's CPU of every `POST /v1/responses`.
    The messages are the same: the headers given, lowercased and in their order, then
    `content-type` and `content-length`. Anything the route or the app would add
    (headers, cookies, a background task) goes the usual way."""

    # The same parameters; it returns an ASGI app, as Litestar's route calls it, where the
    # base class names its `ASGIResponse`.
    def to_asgi_response(  # type: ignore[override]
        self, app: Any, request: Request[Any, Any, Any], *,
        headers: dict[str, str] | None = None, cookies: Any = None,
        background: Any = None, **rest: Any,
    ) -> ASGIApp:
        if (headers or cookies or background or self.cookies or self.background
                or rest.get("is_head_response")):
            return super().to_asgi_response(app, request, headers=headers, cookies=cookies,
                                            background=background, **rest)
        encoded = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                   for name, value in self.headers.items()]
        encoded.append((b"content-type", b"application/json"))
        encoded.append((b"content-length", str(len(self.content)).encode()))
        return _Sent(self.status_code or rest.get("status_code") or 200, encoded, self.content)


class _Sent:
    __slots__ = ("_status", "_headers", "_body")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self._status, self._headers, self._body = status, headers, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self._status,
                    "headers": self._headers})
        await send({"type": "http.response.body", "body": self._body, "more_body": False})
