"""JSON bodies decoded with a nesting limit, for every route at once.

Litestar's decoder (msgspec) raises `RecursionError` around a thousand levels deep,
which Litestar reports as a 500 with a traceback. `BoundedRequest`, the app's request
class, decodes a body that could be deep through `core.bodies.decode_json`, which
refuses anything deeper than `MAX_JSON_DEPTH` with a 400 `json_too_deep` before any
handler, authenticated or not, sees it.

The common case costs two byte counts: a body with fewer brackets than the limit
cannot be nested deeper than it.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.types import Empty

from core.bodies import MAX_JSON_DEPTH, decode_json


class BoundedRequest(Request[Any, Any, Any]):
    __slots__ = ()

    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            body = await self.body()
            if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
                self._json = self._connection_state.json = decode_json(body)
        return await super().json()
