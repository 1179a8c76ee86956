"""Streams whose clients stop reading.

Each piece of a stream must be taken by its client within the process's
`TASKWARD_HTTP_BODY_TIMEOUT_SECONDS` (`ReadInTime`), or the stream ends: a client that
stops reading leaves the stream waiting in `send`, where neither its keep-alives, its
revocation check nor the server's stop reach it, and it held its stream slot and the
pages it had read for ever. The counterpart of `handlers.slow_clients`, which bounds the
wait for a request's body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Litestar, Request
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Message, Receive, Scope, Send


class _NotTaken(Exception):
    """The client took no piece of its stream within the bound."""


class ReadInTime(Stream):
    """The `Stream` of `pieces`, sent as `_TakenInTime` under the serving app's
    `TASKWARD_HTTP_BODY_TIMEOUT_SECONDS` (0: as a plain one)."""

    __slots__ = ("_pieces",)

    def __init__(self, pieces: AsyncGenerator[bytes, None], **options: Any) -> None:
        super().__init__(pieces, **options)
        self._pieces = pieces

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any],
                         **options: Any) -> ASGIResponse:
        streaming = super().to_asgi_response(app, request, **options)
        seconds = request.app.state.services.settings.http_body_timeout_seconds
        return _TakenInTime(streaming, self._pieces, seconds) if seconds else streaming


class _TakenInTime(ASGIResponse):
    """`streaming` (its status, headers and `pieces`), each of whose sends must end
    within `seconds` (`_SendWatch`), or the stream ends whole there, as at a store
    outage: `pieces` is closed, which frees the client's stream slot. The connection
    itself stays with the server until its client reads or leaves, or the process
    ends: granian gives an app no way to cut it."""

    __slots__ = ("_pieces", "_seconds", "_streaming")

    def __init__(self, streaming: ASGIResponse, pieces: AsyncGenerator[bytes, None],
                 seconds: float) -> None:
        super().__init__()  # unused: `streaming` is what is sent
        self._streaming = streaming
        self._pieces = pieces
        self._seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = _SendWatch(send, self._seconds)
        try:
            await self._streaming(scope, receive, watch.send)
        except* _NotTaken:
            pass  # ended whole, as documented; the client resumes from its last `id`
        finally:
            watch.stop()
            await self._pieces.aclose()  # at once, not whenever the collector gets to it


class _SendWatch:
    """The sends of one stream, each cut off (`_NotTaken`) once it has waited `seconds`
    for its client. One timer for the stream, which looks when the send under way would
    fall due and is set again from there, rather than one timer per send: that cost a
    quarter more CPU to replay a long log (20,000 events), this nothing measurable."""

    def __init__(self, send: Send, seconds: float) -> None:
        self._send = send
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None  # when the send under way began
        self._sender: asyncio.Task[Any] | None = None  # the task that waits on it
        self._cut = False
        self._timer = self._loop.call_later(seconds, self._look)

    async def send(self, message: Message) -> None:
        self._sender = asyncio.current_task()
        self._since = self._loop.time()
        try:
            await self._send(message)
        except asyncio.CancelledError:
            # Ours alone (no other cancel of the task pending): the client took too long.
            if self._cut and self._sender is not None and self._sender.uncancel() == 0:
                raise _NotTaken() from None
            raise
        finally:
            self._since = None

    def stop(self) -> None:
        self._timer.cancel()

    def _look(self) -> None:
        now = self._loop.time()
        if self._since is None:
            self._timer = self._loop.call_at(now + self._seconds, self._look)
        elif now - self._since < self._seconds:
            self._timer = self._loop.call_at(self._since + self._seconds, self._look)
        elif self._sender is not None:
            self._cut = True
            self._sender.cancel()  # lands in the send, where the task waits
