"""Waits that hold a stream slot: `?wait=` long-polls and `background: false` requests.

A wait holds a connection and a live-tail waiter as long as a stream does, so it counts
against the client's `max_streams` (`handlers.limits`) while it waits; a read that
does not wait (`wait=0`) holds nothing.

A wait ends when its client leaves, as a stream does: Litestar does not cancel a
handler whose client has gone, so a client that gave up on a 30 s `?wait=` one second
in still held its slot, its waiter and a task of the event loop for the other 29 (a
client with `max_streams: 1` was refused `too_many_streams` all that while).

A wait also ends when its client is revoked, as a stream does: it asks
`handlers.auth.token_still_valid` every `AUTH_RECHECK_SECONDS`, as a stream does, and
answers the `401` any request of the revoked token gets, instead of the task some
seconds later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from litestar.types import Receive
from sqlalchemy import Row

from handlers.auth import ClientRequest, revoked, token_still_valid
from handlers.live import settled
from handlers.services import Services
from handlers.slow_clients import ClientDisconnected
from handlers.sse import AUTH_RECHECK_SECONDS

T = TypeVar("T")


async def held_wait(
    services: Services, request: ClientRequest, task_id: str, owner: str | None,
    timeout: float,
) -> Row[Any]:
    """`handlers.live.settled`, counted as one of the client's streams when it waits,
    and ended when the client leaves or is revoked (`until_left`)."""
    if timeout <= 0:
        return await settled(services.db, services.tail, task_id, owner, timeout)
    end = services.limits.hold_stream(request.user)
    try:
        return await until_left(request.receive, token_still_valid(request), settled(
            services.db, services.tail, task_id, owner, timeout))
    finally:
        end()


async def until_left(
    receive: Receive, still_valid: Callable[[], Awaitable[bool]], waiting: Awaitable[T]
) -> T:
    """What `waiting` gives; or `ClientDisconnected` (answered to nobody, logged
    nowhere) as soon as the client closes its connection: its server says so through
    `receive` once the request's body has been read; or `Unauthorized` within about
    `AUTH_RECHECK_SECONDS` of the client's revocation (`still_valid` false)."""
    wait = asyncio.ensure_future(waiting)
    left = asyncio.ensure_future(_left(receive))
    cut_off = asyncio.ensure_future(_until_revoked(still_valid))
    try:
        await asyncio.wait((wait, left, cut_off), return_when=asyncio.FIRST_COMPLETED)
        if wait.done():
            return wait.result()
        if cut_off.done():
            cut_off.result()  # raises: `Unauthorized`, or the store's failure to answer
        raise ClientDisconnected()
    finally:
        wait.cancel()
        left.cancel()
        cut_off.cancel()


async def _until_revoked(still_valid: Callable[[], Awaitable[bool]]) -> None:
    """Raise `Unauthorized` once the caller no longer holds its credentials; asked as
    often as an idle stream asks."""
    while True:
        await asyncio.sleep(AUTH_RECHECK_SECONDS)
        if not await still_valid():
            raise revoked()


async def _left(receive: Receive) -> None:
    """Return once the client has gone; the rest of a body (an empty last piece) is
    passed over, and a receive that fails says the connection is gone too."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # nothing more can come from this client
        return
