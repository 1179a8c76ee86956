"""The official SDK speaking to the app inside a Litestar TestClient.

For tests that set a task's life up through the store (as `tests/api` does) and then
read it the way an SDK user would, with no server process: an `httpx2` transport hands
each request of the SDK to the TestClient and its answer back.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai
from litestar.testing import TestClient

_HOP_BY_HOP = {"content-length", "content-encoding", "transfer-encoding", "connection"}


def sdk_over(
    http: TestClient[Any], token: str, bodies: list[bytes] | None = None
) -> openai.OpenAI:
    """An SDK client of the app in `http`; each answer's body is added to `bodies`."""
    def handle(request: httpx2.Request) -> httpx2.Response:
        answer = http.request(request.method, request.url.raw_path.decode(),
                              headers=dict(request.headers), content=request.content)
        if bodies is not None:
            bodies.append(answer.content)
        headers = [(k, v) for k, v in answer.headers.multi_items() if k not in _HOP_BY_HOP]
        return httpx2.Response(answer.status_code, headers=headers, content=answer.content)

    return openai.OpenAI(base_url="http://testserver.local/v1", api_key=token, max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handle)))
