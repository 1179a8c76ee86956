"""Request bodies that stall, and clients that leave mid-body.

granian closes a connection that sends no complete request head within its header
timeout (an idle connection, a keep-alive connection nobody reuses, headers trickled
in), but once the head has arrived it waits for the body for ever. This ASGI
middleware bounds the wait for each piece of the body: a client that sends nothing for
`body_timeout_seconds` gets `408 body_timeout` with `Connection: close`, and the
connection is released. A client that disconnects mid-body is not an error of ours:
`ClientDisconnected` ends the request without a log line (`handlers.errors` answers
it, to nobody, as a 400).

A body is complete once its `Content-Length` bytes have come: the piece that brings
them is passed on as the last (`more_body` false). granian hands a body over as its
bytes, then an empty piece that ends it, and each `receive` is a hop through its
threads and back onto the event loop: on a small `POST` that second hop cost more
than reading the body.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from core.errors import DomainError


class ClientDisconnected(Exception):
    """The client closed its connection before its request body was complete."""


class BodyTimeout(DomainError):
    status = 408

    def __init__(self) -> None:
        super().__init__("body_timeout", "the request body did not arrive in time")


def bounded_body_reads(app: ASGIApp, body_timeout_seconds: float) -> ASGIApp:
    """`app` with each `receive` of a request body bounded by `body_timeout_seconds`
    (0: unbounded) and a disconnect mid-body raised as `ClientDisconnected`."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        body_done = False
        unread = _declared_length(scope)

        async def bounded_receive() -> Any:  # an ASGI receive message
            nonlocal body_done, unread
            message: Any
            if body_done:  # a stream waiting for `http.disconnect`: no bound on that
                return await receive()
            try:
                if body_timeout_seconds:
                    # `timeout`, not `wait_for`: on Python 3.11 `wait_for` wraps each
                    # receive in a task of its own.
                    async with asyncio.timeout(body_timeout_seconds):
                        message = await receive()
                else:
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout() from None
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            more = message.get("more_body", False)
            if more and unread is not None:
                unread -= len(message.get("body", b""))
                if unread <= 0:
                    message, more = {**message, "more_body": False}, False
            body_done = not more
            return message

        await app(scope, bounded_receive, send)

    return middleware


def _declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length` (the server has checked its syntax), if any."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
