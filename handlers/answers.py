"""Answer shapes shared by the route modules: lists, and JSON bodies kept as bytes."""

from __future__ import annotations

from typing import Any

from litestar import Response
from litestar.enums import MediaType


def page(data: list[dict[str, Any]], next_cursor: str | None) -> dict[str, Any]:
    """The list object of docs/http-api.md: `{"object": "list", "data", "next_cursor"}`."""
    return {"object": "list", "data": data, "next_cursor": next_cursor}


def task_location(task_id: str) -> dict[str, str]:
    """The status monitor of a task: where a 202 points."""
    return {"Location": f"/v1/tasks/{task_id}"}


def json_bytes(body: bytes, status: int, headers: dict[str, str] | None = None) -> Response[bytes]:
    """A stored JSON body sent byte for byte (idempotent replays must be identical)."""
    return Response(body, status_code=status, media_type=MediaType.JSON, headers=headers)
