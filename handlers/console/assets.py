"""The console's stylesheet and script, served by taskward itself (no CDN, no build).

Pages link each asset with its content digest in the query (`render.asset_url`), so an
answer may be cached for a year: a changed file gets a new address. Only the named
files exist; no path reaches the file system.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response, get
from litestar.params import Parameter

from core.errors import NotFound
from handlers.console.render import ASSETS, asset_bytes
from handlers.heads import head_of

# Litestar adds `; charset=utf-8` to a text type itself.
_MEDIA_TYPES = {".css": "text/css", ".js": "text/javascript"}
_FILES = {name: asset_bytes(name) for name in ASSETS}
_HEADERS = {"Cache-Control": "public, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff"}


@get("/static/{name:str}")
async def asset(name: Annotated[str, Parameter()]) -> Response[bytes]:
    body = _FILES.get(name)
    if body is None:
        raise NotFound("asset_not_found", "no such console asset")
    return Response(body, media_type=_MEDIA_TYPES[name[name.rindex("."):]], headers=_HEADERS)


ROUTES = [asset, head_of(asset)]
