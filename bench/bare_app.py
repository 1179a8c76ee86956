"""A bare Litestar app with one POST handler: the HTTP stack's own ceiling.

`bench/peers.py` serves it exactly as `taskward serve` serves taskward
(`infra.server.serve`, same granian settings) and drives both with the same load
generator, so `POST /v1/responses` can be held against what Litestar and granian
cost by themselves: parse a small JSON body, answer `202` with a small JSON object.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, post


@post("/v1/responses", status_code=202)
async def create(data: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_bare", "object": "response", "status": "queued",
            "model": data.get("model")}


app = Litestar(route_handlers=[create])
