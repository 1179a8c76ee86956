"""Store calls from async handlers, run on threads so the event loop never waits.

Every store operation is a short synchronous transaction (SQLAlchemy Core, sync
drivers). Running them off the event loop keeps streams, long-polls and other requests
moving while one transaction waits on a lock or an fsync.

Reads share a small pool: SQLAlchemy spends most of a point read in Python, so more
threads only fight over the GIL (measured: 8 beat 16). Hot writes (`writing`) to a
store that admits one writer at a time (`Database.single_writer`: SQLite) get ONE
thread per process: a write waiting for its turn then occupies that thread, not one
the reads need.

A request waits for the store at most `TASKWARD_STORE_WAIT_SECONDS` (`bound_waits`):
a PostgreSQL that stops answering without closing its connections (a stalled server,
a network cut that drops packets) would otherwise hold the request, then every store
thread, then every request, for as long as the TCP connection lives (minutes).
Past the bound the request is answered `503 store_unavailable` (`StoreTimeout`); a
call not yet started is cancelled, and one under way is left to finish or fail on
its own thread, so a write it was making may still be applied once the store answers
(docs/operations.md: retry with the same `Idempotency-Key`).

A call that meets a connection the store dropped (an administrator's
`pg_terminate_backend`, a pooler's restart) before it sent a COMMIT is made once more
at once on a fresh one (`through_a_drop`), as the sweeper's loops do: a dead pooled
connection costs one log line, not a `503` to each request that drew one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError

from core.store.database import Database
from core.store.outage import drop_said, is_store_outage
from core.store.redo_dropped import redone_if_dropped_before_commit
from core.thread_pool import DaemonThreadPool

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("taskward.http")

_POOL = DaemonThreadPool(8, "taskward-store")
_SINGLE_WRITER = DaemonThreadPool(1, "taskward-single-writer")


_wait_seconds = 30.0  # the process's bound (`bound_waits`), the setting's default


class StoreTimeout(Exception):
    """The store did not answer a request's call within the process's bound."""


def store_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is what a request hears when the store is out
    (`core.store.outage`) or stalled (the bound passed). Each is answered `503
    store_unavailable` (`handlers.errors`)."""
    return isinstance(exc, StoreTimeout) or is_store_outage(exc)


def bound_waits(seconds: float) -> None:
    """How long a request waits for one store call (`TASKWARD_STORE_WAIT_SECONDS`)."""
    global _wait_seconds
    _wait_seconds = seconds


def wait_seconds() -> float:
    """The process's bound, for a wait kept by other means (the group commit's timer)."""
    return _wait_seconds


async def blocking(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` on the store thread pool (`through_a_drop`); its
    result or its exception, or `StoreTimeout` past the process's bound."""
    return await _bounded(_POOL, _call_of(function, *args, **kwargs))


async def lengthy(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Like `blocking`, without the bound: for a call whose own work may outlast it
    (hashing a model file of many gigabytes before its one short write)."""
    return await _run(_POOL, _call_of(function, *args, **kwargs))


async def writing(
    db: Database, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Like `blocking`, for a call that is one short write transaction on `db`."""
    return await _bounded(_writers(db), _call_of(function, *args, **kwargs))


async def group_writing(
    db: Database, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Like `writing`, without the bound, and never made again: the group commit's own
    call, which answers the requests of its batch however late, and makes each
    request's own store call `through_a_drop` (`handlers.enqueuing`)."""
    return await _run(_writers(db), functools.partial(function, *args, **kwargs))


def through_a_drop(call: Callable[[], T]) -> T:
    """`call()`, on the calling thread, made once more at once on a fresh connection when
    the store dropped the connection under it before it sent a COMMIT
    (`core.store.redo_dropped.redone_if_dropped_before_commit`): one line in the log
    and the request is answered. A second drop, or one at a COMMIT (which may have
    landed), is raised: `503 store_unavailable` (`handlers.errors`)."""
    return redone_if_dropped_before_commit(call, _heard_drop)


def _call_of(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
    """`function(*args, **kwargs)`, to be made on a store thread `through_a_drop`."""
    return functools.partial(through_a_drop, functools.partial(function, *args, **kwargs))


def _heard_drop(exc: DBAPIError) -> None:
    log.warning("%s", drop_said("request", "making its store call again", exc))


def _writers(db: Database) -> DaemonThreadPool:
    return _SINGLE_WRITER if db.single_writer else _POOL


async def _bounded(pool: DaemonThreadPool, call: Callable[[], T]) -> T:
    try:
        async with asyncio.timeout(_wait_seconds):
            return await _run(pool, call)
    except TimeoutError:
        raise StoreTimeout from None


async def _run(pool: DaemonThreadPool, call: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool, call)
