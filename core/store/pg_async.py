"""Statements that commit by themselves, run on the event loop (PostgreSQL).

Every other store call runs on a thread (`handlers.threads`): a hop there and back
per call, and the GIL passed between the event loop and the thread each way. For the
API's busiest write, births that commit by themselves (`core.store.new_tasks`,
`enqueue_many_async`), that hop cost more than the statement: psycopg's asyncio
connection runs it on the loop itself, waiting for the server as the loop waits for a
socket. The connections are this object's own, in autocommit, opened when first
needed and kept, each with its cursor, for the next statement (as many as statements
ran at once, which the caller bounds), dropped when found broken, or found ended by the
server while they were kept (`closed_while_idle`). Driver errors come out as
SQLAlchemy's, as from `core.store.driver` (`sqlalchemy_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Dialect

from core.store.database import Database
from core.store.driver import sqlalchemy_error
from core.store.libpq import closed_while_idle, libpq_conninfo

if TYPE_CHECKING:
    from psycopg import AsyncCursor


class AutocommitConnections:
    def __init__(self, db: Database) -> None:
        self._conninfo = libpq_conninfo(db.engine)
        self.dialect: Dialect = db.engine.dialect
        self._idle: list[AsyncCursor[Any]] = []  # one cursor per connection, kept with it

    async def first_row(self, query: str, params: Mapping[str, Any]) -> Any:
        """The first row `query` returns, committed before it returns.

        The statement is prepared from its first run (the caller's statements are
        few, each run again and again), and each connection keeps its cursor: a
        cursor made per statement, and psycopg's count of runs before it prepares,
        cost more on the event loop than the statement's own adaptation."""
        import psycopg  # SQLite processes never load it

        try:
            cursor = await self._usable_idle() or (await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True)).cursor()
        except psycopg.Error as exc:
            raise sqlalchemy_error(exc, self.dialect) from exc
        try:
            await cursor.execute(query, params, prepare=True)
            row = await cursor.fetchone()
        except psycopg.Error as exc:
            if cursor.connection.broken or cursor.connection.closed:
                await cursor.connection.close()
            else:
                self._idle.append(cursor)
            raise sqlalchemy_error(exc, self.dialect) from exc
        except BaseException:  # cancelled, say, mid-statement: the connection's state
            await cursor.connection.close()  # is unknown
            raise
        self._idle.append(cursor)
        return row

    async def _usable_idle(self) -> AsyncCursor[Any] | None:
        """A kept cursor whose connection the server did not end meanwhile
        (`closed_while_idle`); those it did are closed. None: none is left."""
        while self._idle:
            cursor = self._idle.pop()
            if not closed_while_idle(cursor.connection):
                return cursor
            await cursor.connection.close()
        return None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for cursor in idle:
            await cursor.connection.close()
