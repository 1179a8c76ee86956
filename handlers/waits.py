"""Waits that hold a stream slot: `?wait=` long-polls and `background: false` requests.

A wait holds a connection and a live-tail waiter as long as a stream does, so it counts
against the client's `max_streams` (`handlers.limits`) while it waits; a read that
does not wait (`wait=0`) holds nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from core.clients import Client
from handlers.live import settled
from handlers.services import Services


async def held_wait(
    services: Services, client: Client, task_id: str, owner: str | None, timeout: float
) -> Row[Any]:
    """`handlers.live.settled`, counted as one of the client's streams when it waits."""
    if timeout <= 0:
        return await settled(services.db, services.tail, task_id, owner, timeout)
    end = services.limits.hold_stream(client)
    try:
        return await settled(services.db, services.tail, task_id, owner, timeout)
    finally:
        end()
