"""Hot statements run on the driver's own cursor, with SQLAlchemy's errors.

SQLAlchemy's work around one execution (checking out a `Connection`, processing the
compiled statement's parameters, building a result, its transaction bookkeeping) cost
more than the driver's own for the statements that create tasks: measured in
isolation on PostgreSQL, the births statement with its BEGIN and COMMIT took ~450 us of
CPU through SQLAlchemy and ~75 us as the same text on a psycopg cursor. Those
statements are built with SQLAlchemy as usual and compiled once (`driver_text`); here
they run on the driver, inside the caller's transaction (`driver_cursor`) or as a
transaction of their own (`autocommit_cursor`: PostgreSQL commits a lone statement by
itself, so BEGIN and COMMIT, two of the three round trips, are not sent).

A driver error comes out as SQLAlchemy's (`DBAPIError.instance`, parameters left out
of the message: they hold prompts), so callers meet the exceptions of any other
statement (a full disk or a lost server is `OperationalError`, a 503; a NUL character
`DataError`, a 422).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from core.store.database import commit_begun


def driver_text(
    statement: ClauseElement, dialect: Dialect, variables: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """`statement` compiled for `dialect`: its text and the values of its constant
    parameters (the literals SQLAlchemy binds), to which each execution adds its
    `variables` (any value of the right type: only their names are used here)."""
    compiled = statement.compile(dialect=dialect)
    bound = compiled.construct_params(dict(variables)) or {}
    constants = {name: value for name, value in bound.items() if name not in variables}
    return compiled.string, constants


@dataclass(frozen=True)
class DriverStatement:
    """A statement compiled once for a driver cursor and run with its values by name on
    either store: sqlite3's marks are positional (`?`), so the names are kept in their
    order; psycopg's are named."""

    text: str
    names: tuple[str, ...]
    positional: bool

    def scalar(self, cursor: Any, values: Mapping[str, Any]) -> Any:
        """The first column of the first row `values` select, None for no row."""
        cursor.execute(self.text, tuple(values[name] for name in self.names)
                       if self.positional else {name: values[name] for name in self.names})
        row = cursor.fetchone()
        return None if row is None else row[0]


@cache
def driver_statement(statement: ClauseElement, dialect: Dialect) -> DriverStatement:
    """`statement` compiled for `dialect`'s driver, once per statement and dialect."""
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)  # a statement's, not DDL's
    positional = compiled.positiontup is not None
    return DriverStatement(compiled.string, tuple(compiled.positiontup or compiled.params),
                           positional)


def placeholder(dialect: Dialect) -> str:
    """The driver's positional parameter mark: sqlite3's `?`, psycopg's `%s`."""
    return "?" if dialect.name == "sqlite" else "%s"


@contextmanager
def driver_cursor(conn: Connection) -> Iterator[Any]:
    """A cursor of `conn`'s own driver connection, in its transaction."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        with _sqlalchemy_errors(conn.dialect):
            yield cursor
    finally:
        cursor.close()


@contextmanager
def autocommit_cursor(engine: Engine) -> Iterator[Any]:
    """A driver cursor on a pooled connection whose every statement commits by itself
    before it returns (a read is its own snapshot); the connection goes back to the
    pool as it came.
    A connection found broken is dropped from the pool, as SQLAlchemy drops it; one
    that cannot be made (the server is down) raises as SQLAlchemy's would. Counted as a
    commit begun (`core.store.database.commits_begun`): a statement that fails may have
    committed all the same."""
    commit_begun()
    try:  # a bare `try` (free in 3.11), not `_sqlalchemy_errors`: this is every birth's
        pooled = engine.raw_connection()
    except engine.dialect.loaded_dbapi.Error as exc:
        raise sqlalchemy_error(exc, engine.dialect) from exc
    driver = pooled.driver_connection
    # sqlite3's connections of a `Database` always are (BEGIN is ours to send).
    toggled = engine.dialect.name != "sqlite"
    broken: BaseException | None = None
    try:
        if toggled:
            driver.autocommit = True  # type: ignore[union-attr]
        cursor = driver.cursor()  # type: ignore[union-attr]
        try:
            with _sqlalchemy_errors(engine.dialect):
                try:
                    yield cursor
                except engine.dialect.loaded_dbapi.Error as exc:
                    if engine.dialect.is_disconnect(exc, pooled.dbapi_connection, cursor):
                        broken = exc
                    raise
        finally:
            cursor.close()
    finally:
        if broken is not None:
            # What SQLAlchemy does on a disconnect: this connection is dropped, and every
            # other one the pool holds is replaced at its next checkout (after a server
            # restart they are all dead), so one request fails, not one per connection.
            engine.pool._invalidate(pooled, broken)
        elif toggled:
            driver.autocommit = False  # type: ignore[union-attr]
        pooled.close()


@contextmanager
def _sqlalchemy_errors(dialect: Dialect) -> Iterator[None]:
    try:
        yield
    except dialect.loaded_dbapi.Error as exc:
        raise sqlalchemy_error(exc, dialect) from exc


def sqlalchemy_error(exc: Exception, dialect: Dialect) -> StatementError:
    """The driver's error `exc` as SQLAlchemy raises it, its parameters left out."""
    return DBAPIError.instance(None, None, exc, dialect.loaded_dbapi.Error,
                               hide_parameters=True, dialect=dialect)
