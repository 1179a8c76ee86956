"""Request bodies that stall, and clients that leave mid-body.

granian closes a connection that sends no complete request head within its header
timeout (an idle connection, a keep-alive connection nobody reuses, headers trickled
in), but once the head has arrived it waits for the body for ever. This ASGI
middleware bounds the wait for each piece of the body: a client that sends nothing for
`body_timeout_seconds` gets `408 body_timeout` with `Connection: close`, and the
connection is released. A client that disconnects mid-body is not an error of ours:
`ClientDisconnected` ends the request without a log line (`handlers.errors` answers
it as a `400 client_disconnected`). granian reports a body it cannot frame (a chunk
size that is not hex, an endless chunk extension) as a disconnect too, so that answer
may reach a client still there; its detail holds for both.

A body is complete once its `Content-Length` bytes have come: the piece that brings
them is passed on as the last (`more_body` false). granian hands a body over as its
bytes, then an empty piece that ends it, and each `receive` is a hop through its
threads and back onto the event loop: on a small `POST` that second hop cost more
than reading the body.

The bound is kept by one timer per event loop, not one per read: each read notes its
deadline, and a look every quarter of the timeout (at most every second) ends the
reads past theirs, so a stalled body is answered between the timeout and a quarter
more. A timer per read (`asyncio.timeout`) cost ~0.02 CPU-ms of a small `POST`.

The connection of a stalled body is released only once granian's request object (what
`receive` and `send` are bound to) is freed: it holds the body stream, and hyper stops
reading the body and closes the connection when that stream is dropped. So nothing
here may hold `receive` in a reference cycle, which only the cyclic collector frees,
at a time nobody chose: a `bounded_receive` that named itself (to tell `arrivals` its
body was read) left the 408 sent and the connection open in most runs.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from core.errors import DomainError
from handlers.arrivals import Arrivals


class ClientDisconnected(Exception):
    """The request body ended before it was complete: the client closed its connection,
    or sent a body granian could not frame (which it reports alike)."""


class BodyTimeout(DomainError):
    status = 408

    def __init__(self) -> None:
        super().__init__("body_timeout", "the request body did not arrive in time")


class _Deadlines:
    """The body reads in progress on one event loop, each with its deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self._loop = loop
        self._seconds = seconds
        self._every = min(seconds / 4, 1.0)
        self._reads: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._look_at: asyncio.TimerHandle | None = None

    def begin(self, task: asyncio.Task[Any]) -> None:
        self._reads[task] = self._loop.time() + self._seconds
        if self._look_at is None:
            self._look_at = self._loop.call_later(self._every, self._look)

    def end(self, task: asyncio.Task[Any]) -> bool:
        """Whether this read was ended by its deadline (its task then cancelled here)."""
        del self._reads[task]
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    def _look(self) -> None:
        now = self._loop.time()
        for task, deadline in self._reads.items():
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._look_at = self._loop.call_later(self._every, self._look) if self._reads else None


def bounded_body_reads(app: ASGIApp, body_timeout_seconds: float,
                       arrivals: Arrivals | None = None) -> ASGIApp:
    """`app` with each `receive` of a request body bounded by `body_timeout_seconds`
    (0: unbounded) and a disconnect mid-body raised as `ClientDisconnected`; each
    declared body, from its request's start until it has been read, known to
    `arrivals` (`handlers.arrivals`)."""
    per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = (
        weakref.WeakKeyDictionary())

    def deadlines() -> _Deadlines:
        loop = asyncio.get_running_loop()
        found = per_loop.get(loop)
        if found is None:
            found = per_loop[loop] = _Deadlines(loop, body_timeout_seconds)
        return found

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        body_done = False
        unread = _declared_length(scope)
        reading = object()  # this body, as `arrivals` knows it (not `bounded_receive`: above)

        async def bounded_receive() -> Any:  # an ASGI receive message
            nonlocal body_done, unread
            message: Any
            if body_done:  # a stream waiting for `http.disconnect`: no bound on that
                return await receive()
            if body_timeout_seconds:
                reads, task = deadlines(), asyncio.current_task()
                assert task is not None
                reads.begin(task)
                try:
                    message = await receive()
                except BaseException:  # our cancellation, or anything as the deadline came
                    if reads.end(task):
                        raise BodyTimeout() from None
                    raise
                if reads.end(task):  # its deadline came with the body: too late all the same
                    raise BodyTimeout()
            else:
                message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            more = message.get("more_body", False)
            if more and unread is not None:
                unread -= len(message.get("body", b""))
                if unread <= 0:
                    message, more = {**message, "more_body": False}, False
            body_done = not more
            if body_done and arrivals is not None:
                arrivals.finished(reading)
            return message

        if arrivals is None or not unread:
            await app(scope, bounded_receive, send)
            return
        arrivals.started(reading)
        try:
            await app(scope, bounded_receive, send)
        finally:
            arrivals.finished(reading)

    return middleware


def _declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length` (the server has checked its syntax), if any."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
