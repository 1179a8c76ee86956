"""Statements that commit by themselves, run on the event loop (PostgreSQL).

Every other store call runs on a thread (`handlers.threads`): a hop there and back
per call, and the GIL passed between the event loop and the thread each way. For the
API's busiest write, births that commit by themselves (`core.store.new_tasks`,
`enqueue_many_async`), that hop cost more than the statement: psycopg's asyncio
connection runs it on the loop itself, waiting for the server as the loop waits for a
socket. The connections are this object's own, in autocommit, opened when first
needed and kept for the next statement (as many as statements ran at once, which the
caller bounds), dropped when found broken. Driver errors come out as SQLAlchemy's,
as from `core.store.driver`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import DBAPIError

from core.store.database import Database

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class AutocommitConnections:
    def __init__(self, db: Database) -> None:
        url = make_url(db.engine.url).set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self.dialect: Dialect = db.engine.dialect
        self._idle: list[AsyncConnection[Any]] = []

    @asynccontextmanager
    async def cursor(self) -> AsyncIterator[Any]:
        """An asyncio cursor whose every statement commits before it returns."""
        import psycopg  # SQLite processes never load it

        try:
            conn = self._idle.pop() if self._idle else await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise self._sqlalchemy_error(exc) from exc
        try:
            async with conn.cursor() as cursor:
                yield cursor
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                await conn.close()
            else:
                self._idle.append(conn)
            raise self._sqlalchemy_error(exc) from exc
        except BaseException:  # cancelled, say, mid-statement: the connection's state
            await conn.close()  # is unknown
            raise
        self._idle.append(conn)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    def _sqlalchemy_error(self, exc: Exception) -> Exception:
        import psycopg

        return DBAPIError.instance(None, None, exc, psycopg.Error, hide_parameters=True,
                                   dialect=self.dialect)
