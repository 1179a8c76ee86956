"""JSON bodies decoded with a nesting limit, for every route at once.

msgspec, Litestar's decoder, recurses per level and raises `RecursionError` (not a
decode error) around a thousand levels deep, which Litestar reports as a 500 with a
traceback; pydantic and `json.dumps` would recurse again further on. No body we accept
is more than a handful of levels deep, so `BoundedRequest`, the app's request class,
refuses anything deeper than `MAX_JSON_DEPTH` with a 400 `json_too_deep` before any
handler, authenticated or not, sees it.

The common case costs two byte counts: a body with fewer brackets than the limit
cannot be nested deeper than it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.types import Empty

from core.errors import DomainError

MAX_JSON_DEPTH = 64


class BoundedRequest(Request[Any, Any, Any]):
    __slots__ = ()

    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
                self._json = self._connection_state.json = _shallow(body)
        return await super().json()


def _shallow(body: bytes) -> Any:
    """The decoded body, or `json_too_deep`; malformed JSON is left to Litestar's 400."""
    try:
        value = msgspec.json.decode(body)
    except RecursionError:
        raise _too_deep() from None
    except msgspec.DecodeError:
        return Empty
    if _depth_exceeds(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep; iterative, so it cannot overflow."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in children
                         if isinstance(child, dict | list))
    return False


def _too_deep() -> DomainError:
    return DomainError("json_too_deep",
                       f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
