"""Cursor pages: newest first, the cursor being the last id of a page.

Ids sort by creation time (`core.ids.sortable_id`), so `id < cursor` is the next page
and no offset ever scans what was already shown.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, Row, Select


def newest_first(
    conn: Connection, query: Select[Any], id_column: Column[Any], *, limit: int,
    after: str | None,
) -> tuple[list[Row[Any]], str | None]:
    """One page of `query` and the cursor of the next page (None on the last one)."""
    query = query.order_by(id_column.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(id_column < after)
    rows = list(conn.execute(query))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, getattr(rows[-1], id_column.key)
