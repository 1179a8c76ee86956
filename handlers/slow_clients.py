"""Request bodies that stall, and clients that leave mid-body.

granian closes a connection that sends no complete request head within its header
timeout (an idle connection, a keep-alive connection nobody reuses, headers trickled
in), but once the head has arrived it waits for the body for ever. This ASGI
middleware bounds the wait for each piece of the body: a client that sends nothing for
`body_timeout_seconds` gets `408 body_timeout` with `Connection: close`, and the
connection is released. A client that disconnects mid-body is not an error of ours:
`ClientDisconnected` ends the request without a log line (`handlers.errors` answers
it, to nobody, as a 400).
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

        async def bounded_receive() -> Any:  # an ASGI receive message
            nonlocal body_done
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
            body_done = not message.get("more_body", False)
            return message

        await app(scope, bounded_receive, send)

    return middleware
