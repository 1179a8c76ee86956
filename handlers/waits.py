"""Waits that hold a stream slot: `?wait=` long-polls and `background: false` requests.

A wait holds a connection and a live-tail waiter as long as a stream does, so it counts
against the client's `max_streams` (`handlers.limits`) while it waits; a read that
does not wait (`wait=0`) holds nothing.

A wait ends when its client leaves, as a stream does: Litestar does not cancel a
handler whose client has gone, so a client that gave up on a 30 s `?wait=` one second
in still held its slot, its waiter and a task of the event loop for the other 29 (a
client with `max_streams: 1` was refused `too_many_streams` all that while).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar.types import Receive
from sqlalchemy import Row

from core.clients import Client
from handlers.live import settled
from handlers.services import Services
from handlers.slow_clients import ClientDisconnected

T = TypeVar("T")


async def held_wait(
    services: Services, client: Client, receive: Receive, task_id: str, owner: str | None,
    timeout: float,
) -> Row[Any]:
    """`handlers.live.settled`, counted as one of the client's streams when it waits,
    and ended when the client leaves (`until_left`)."""
    if timeout <= 0:
        return await settled(services.db, services.tail, task_id, owner, timeout)
    end = services.limits.hold_stream(client)
    try:
        return await until_left(receive, settled(services.db, services.tail, task_id, owner,
                                                 timeout))
    finally:
        end()


async def until_left(receive: Receive, waiting: Awaitable[T]) -> T:
    """What `waiting` gives, or `ClientDisconnected` (answered to nobody, logged
    nowhere) as soon as the client closes its connection: its server says so through
    `receive` once the request's body has been read."""
    wait = asyncio.ensure_future(waiting)
    left = asyncio.ensure_future(_left(receive))
    try:
        await asyncio.wait((wait, left), return_when=asyncio.FIRST_COMPLETED)
        if wait.done():
            return wait.result()
        raise ClientDisconnected()
    finally:
        wait.cancel()
        left.cancel()


async def _left(receive: Receive) -> None:
    """Return once the client has gone; the rest of a body (an empty last piece) is
    passed over, and a receive that fails says the connection is gone too."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # nothing more can come from this client
        return
