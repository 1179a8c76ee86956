"""Store calls from async handlers, run on threads so the event loop never waits.

Every store operation is a short synchronous transaction (SQLAlchemy Core, sync
drivers). Running them off the event loop keeps streams, long-polls and other requests
moving while one transaction waits on a lock or an fsync.

Reads share a small pool: SQLAlchemy spends most of a point read in Python, so more
threads only fight over the GIL (measured: 8 beat 16). Hot writes (`writing`) to a
store that admits one writer at a time (`Database.single_writer`: SQLite) get ONE
thread per process: a write waiting for its turn then occupies that thread, not one
the reads need.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from core.store.database import Database
from core.thread_names import name_pool_thread

P = ParamSpec("P")
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="taskward-store",
                           initializer=name_pool_thread)
_SINGLE_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskward-single-writer",
                                    initializer=name_pool_thread)


async def blocking(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` on the store thread pool; its result or its exception."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(function, *args, **kwargs))


async def writing(
    db: Database, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Like `blocking`, for a call that is one short write transaction on `db`."""
    pool = _SINGLE_WRITER if db.single_writer else _POOL
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool, functools.partial(function, *args, **kwargs))
