"""The process's one HTTP client for every upstream, on one event-loop thread.

Engine threads are blocking, but an upstream stream must close the moment a cancel or a
lost lease says so, also while the server is silent (a long prompt, a full queue): a
blocking read cannot be interrupted from another thread, an asyncio task can. So each
request runs as a task on this loop and hands its lines to the engine thread through a
queue; cancelling the task closes the connection, and the server frees its slot.

One pooled `httpx.AsyncClient` per process (re-created after a fork), redirects never
followed: a redirect could send the request, and its key, to a host nobody allowed.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import httpx

_lock = threading.Lock()
_transport: _Transport | None = None


@dataclass(frozen=True)
class Status:
    """The upstream answered with something other than 200; its body is never read."""

    code: int
    retry_after: str | None


END = object()  # the stream is over (after [DONE], or the connection ended)


class _Transport:
    def __init__(self, max_connections: int) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="upstream-http",
                                        daemon=True)
        self._thread.start()
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self.client: httpx.AsyncClient = self.run(_new_client(limits)).result()

    def run(self, work: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)


async def _new_client(limits: httpx.Limits) -> httpx.AsyncClient:
    return httpx.AsyncClient(follow_redirects=False, limits=limits)


def _shared(max_connections: int) -> _Transport:
    global _transport
    with _lock:
        if _transport is None or _transport.pid != os.getpid():
            _transport = _Transport(max_connections)
        return _transport


def open_stream(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout: httpx.Timeout,
    into: queue.SimpleQueue[Any], *, max_connections: int,
) -> Future[Any]:
    """POST `body` to `url` with `stream: true` and put into `into`, in order: a `Status`
    (then END) for a non-200 answer, else each `data:` payload parsed as JSON; then END.
    A transport failure is put as the exception itself, before END. Cancelling the
    returned future closes the connection at once."""
    transport = _shared(max_connections)
    return transport.run(_pump(transport.client, url, body, headers, timeout, into))


async def _pump(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
    timeout: httpx.Timeout, into: queue.SimpleQueue[Any],
) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers,
                                 timeout=timeout) as response:
            if response.status_code != 200:
                into.put(Status(response.status_code, response.headers.get("retry-after")))
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, keep-alives
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                into.put(json.loads(payload))
    except Exception as exc:  # the engine thread maps it to an error code
        into.put(exc)
    finally:
        into.put(END)
