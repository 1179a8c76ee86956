"""`transitions.insert_events`: the rows `move` collected, stored as given and announced
once committed, on both stores (SQLite's go to the driver's `executemany`)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from core.store.database import EVENTS_CHANNEL, Database, Logged, LoggedEvent
from core.store.transitions import encoded, insert_events
from core.tables import task_events


def _row(task_id: str, seq: int, data: dict[str, Any]) -> dict[str, Any]:
    return {"task_id": task_id, "seq": seq, "type": "response.output_text.delta",
            "created_at": 2**41 + seq, "data": encoded(data)}


def _stored(db: Database) -> list[tuple[Any, ...]]:
    with db.read() as conn:
        return [tuple(row) for row in conn.execute(
            select(task_events).order_by(task_events.c.task_id, task_events.c.seq))]


def test_rows_are_stored_as_given_and_announced_after_the_commit(db: Database) -> None:
    heard: list[Logged] = []
    stop = db.listen(EVENTS_CHANNEL, heard.append)
    # Text beyond ASCII, quotes and a NUL-free backslash, and stamps past 32 bits.
    rows = [_row("resp_a", seq, {"delta": f"é😀 \"{seq}\" \\"}) for seq in (1, 2, 3)]
    rows.append(_row("resp_b", 7, {"delta": ""}))
    try:
        with db.write_events() as conn:
            insert_events(conn, rows)
            assert heard == []  # nothing is announced before the commit
    finally:
        stop()
    assert _stored(db) == [(r["task_id"], r["seq"], r["type"], r["created_at"], r["data"])
                           for r in rows]
    assert sorted(heard) == [
        Logged("resp_a", tuple(LoggedEvent(r["seq"], r["type"], r["created_at"], r["data"])
                               for r in rows[:3])),
        Logged("resp_b", (LoggedEvent(7, rows[3]["type"], rows[3]["created_at"],
                                      rows[3]["data"]),)),
    ]


def test_a_number_taken_twice_is_sqlalchemys_integrity_error_and_writes_nothing(
    db: Database,
) -> None:
    with db.write_events() as conn:
        insert_events(conn, [_row("resp_a", 1, {"delta": "first"})])
    with pytest.raises(IntegrityError), db.write_events() as conn:
        insert_events(conn, [_row("resp_a", 2, {"delta": "second"}),
                             _row("resp_a", 1, {"delta": "again"})])
    assert [(task_id, seq) for task_id, seq, *_ in _stored(db)] == [("resp_a", 1)]
