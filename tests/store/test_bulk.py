"""`insert_rows` and `json_rows`: many rows as one parameter, same result as row by row."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import BigInteger, String, select
from sqlalchemy.exc import DataError

from core.store.bulk import insert_rows, json_rows, rows_param
from core.store.database import Database
from core.tables import schedule_slots


def _slot(schedule_id: str, slot_at: int, task_id: str = "") -> dict[str, Any]:
    return {"schedule_id": schedule_id, "slot_at": slot_at, "task_id": task_id, "created_at": 0}


@pytest.mark.parametrize("count", [1, 3, 250])
def test_rows_come_back_exactly_as_given(db: Database, count: int) -> None:
    # Text beyond ASCII (an emoji needs a surrogate pair in JSON), quotes, backslashes,
    # and integers past 32 bits must survive the JSON trip unchanged.
    rows = [_slot(f"s-{n}-é😀\"\\'", 2**40 + n, f"t{n}") for n in range(count)]
    with db.write() as conn:
        back = insert_rows(conn, schedule_slots, rows, returning=[schedule_slots.c.schedule_id,
                                                                  schedule_slots.c.slot_at])
    assert sorted((r.schedule_id, r.slot_at) for r in back) == sorted(
        (r["schedule_id"], r["slot_at"]) for r in rows)
    with db.read() as conn:
        stored = conn.execute(select(schedule_slots).order_by(schedule_slots.c.slot_at)).all()
    assert [dict(r._mapping) for r in stored] == sorted(rows, key=lambda r: r["slot_at"])


def test_conflicting_rows_are_skipped_and_not_returned(db: Database) -> None:
    with db.write() as conn:
        insert_rows(conn, schedule_slots, [_slot("a", 1, "first")])
        back = insert_rows(conn, schedule_slots,
                           [_slot("a", 1, "second"), _slot("b", 1), _slot("b", 1, "dup")],
                           skip_conflicts=True, returning=[schedule_slots.c.task_id])
    # The earlier row wins, within the statement as against the table.
    assert [r.task_id for r in back] == [""]
    with db.read() as conn:
        assert dict(conn.execute(select(schedule_slots.c.schedule_id,
                                        schedule_slots.c.task_id)).all()) == {"a": "first", "b": ""}


def test_a_nul_character_is_stored_by_sqlite_and_refuses_the_statement_on_postgresql(
    db: Database,
) -> None:
    rows = [_slot("ok", 1), _slot("bad\x00", 2)]
    if db.is_sqlite:
        with db.write() as conn:
            insert_rows(conn, schedule_slots, rows)
    else:
        with pytest.raises(DataError), db.write() as conn:
            insert_rows(conn, schedule_slots, rows)
    with db.read() as conn:
        stored = conn.execute(select(schedule_slots.c.schedule_id)).scalars().all()
    assert sorted(stored) == (["bad\x00", "ok"] if db.is_sqlite else [])


def test_json_rows_reads_rows_as_a_table(db: Database) -> None:
    given = json_rows(db.engine.dialect.name, "given", [("name", String()), ("n", BigInteger())])
    rows = [{"name": "x😀", "n": 2**40}, {"name": "y", "n": -1}]
    with db.read() as conn:
        read = conn.execute(select(given.c.name, given.c.n), {"given": rows_param(rows)}).all()
    assert [tuple(r) for r in read] == [("x😀", 2**40), ("y", -1)]
