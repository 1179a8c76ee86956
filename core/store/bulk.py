"""Many rows in one statement on either store, with a statement text that does not
depend on how many rows there are.

On PostgreSQL a statement with hundreds of parameters is re-parsed by psycopg on every
call (its query cache stops at 50 parameters) and never prepared by the server: most
of a schedule-firing pass went there. Here many rows travel as ONE JSON parameter,
read as a table (`json_to_recordset` on PostgreSQL, `json_each` on SQLite), and
msgspec encodes them far faster than psycopg escapes arrays of strings.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from functools import cache
from types import ModuleType
from typing import Any

import msgspec
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    FromClause,
    Row,
    Table,
    bindparam,
    cast,
    column,
    func,
    select,
)
from sqlalchemy.types import TypeEngine


def dialect_module(dialect_name: str) -> ModuleType:
    """A store's SQLAlchemy dialect (its `insert` builds ON CONFLICT statements), imported
    when a statement needs it: a process then loads its own store's only (issue 15; see
    `core.tables`)."""
    return importlib.import_module(f"sqlalchemy.dialects.{dialect_name}")


def json_rows(
    dialect_name: str, name: str, columns: Sequence[tuple[str, TypeEngine[Any]]]
) -> FromClause:
    """A table named `name` with `columns`, whose rows are the bound parameter `name`:
    pass `rows_param(rows)` for it. Build statements with it once per dialect."""
    if dialect_name == "postgresql":
        return (func.json_to_recordset(cast(bindparam(name), JSON))
                .table_valued(*(column(key, kind) for key, kind in columns))
                .render_derived(name=name, with_types=True))
    items = func.json_each(bindparam(name)).table_valued("value")
    return select(*(cast(func.json_extract(items.c.value, f"$.{key}"), kind).label(key)
                    for key, kind in columns)).select_from(items).subquery(name)


def rows_param(rows: Sequence[Mapping[str, Any]]) -> str:
    """The value of a `json_rows` parameter (msgspec: a new task's row in 0.8 us, the
    standard encoder took 6, on every request's way to the store)."""
    return msgspec.json.encode(rows).decode()


def insert_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    *,
    skip_conflicts: bool = False,
    returning: Sequence[Column[Any]] = (),
) -> list[Row[Any]]:
    """Insert `rows` (all with the same keys) in one statement; the `returning` columns
    of the rows inserted come back (with `skip_conflicts`, a row a unique index refuses
    is skipped and does not come back).

    Several rows on PostgreSQL go as `INSERT … SELECT FROM json_to_recordset(…)`; one
    row as plain VALUES, which is cheaper there. SQLite takes the rows as an
    executemany, which the sqlite3 module runs without that cost.
    """
    if not rows:
        return []
    keys = tuple(rows[0])
    finish = (table, skip_conflicts, tuple(column.key for column in returning))
    if conn.dialect.name == "postgresql" and len(rows) > 1:
        result = conn.execute(_recordset_insert(keys, *finish), {"rows": rows_param(rows)})
    else:
        result = conn.execute(_values_insert(conn.dialect.name, *finish), list(rows))
    return list(result) if returning else []


@cache
def _values_insert(
    dialect_name: str, table: Table, skip_conflicts: bool, returning: tuple[str, ...]
) -> Any:
    return _finished(dialect_module(dialect_name).insert(table), table, skip_conflicts,
                     returning)


@cache
def _recordset_insert(
    keys: tuple[str, ...], table: Table, skip_conflicts: bool, returning: tuple[str, ...]
) -> Any:
    given = json_rows("postgresql", "rows", [(key, table.c[key].type) for key in keys])
    statement = dialect_module("postgresql").insert(table).from_select(
        [table.c[key] for key in keys], select(*given.c))
    return _finished(statement, table, skip_conflicts, returning)


def _finished(statement: Any, table: Table, skip_conflicts: bool,
              returning: tuple[str, ...]) -> Any:
    """The ON CONFLICT and RETURNING clauses both insert statements share."""
    if skip_conflicts:
        statement = statement.on_conflict_do_nothing()
    if returning:
        statement = statement.returning(*(table.c[key] for key in returning))
    return statement
