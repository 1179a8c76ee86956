"""The rule every store call redone through a dropped connection keeps
(`core.store.redo_dropped`): its tries a pause apart, the drop raised after the last,
any other error at once; a write's first try made at once, a read after a drop paused
before each of its tries."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NoReturn

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from core.store import redo_dropped
from core.store.database import Database
from core.store.redo_dropped import NOT_LANDED, Landing, read_after_drop, write_through_drops

PAUSES = (0.01, 0.02, 0.03)


@dataclass(frozen=True)
class Item:
    task_id: str


def _dropped() -> OperationalError:
    """A store call whose connection ended under it (SQLAlchemy saw the connection go)."""
    return OperationalError("COMMIT", None, Exception("server closed the connection"),
                            connection_invalidated=True)


def _locked() -> OperationalError:
    """An error that is no drop: SQLite's locked file."""
    return OperationalError("COMMIT", None, sqlite3.OperationalError("database is locked"))


@pytest.fixture
def paused(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses the tries made, in turn, recorded instead of slept; the tries' pauses
    are `PAUSES`."""
    pauses: list[float] = []
    monkeypatch.setattr(redo_dropped, "TRY_PAUSES_SECONDS", PAUSES)
    monkeypatch.setattr(redo_dropped, "time", SimpleNamespace(sleep=pauses.append))
    return pauses


def _raising(error: OperationalError, tries: list[None]) -> Any:
    """A call that counts itself in `tries` and raises `error`."""
    def call(*_args: Any) -> NoReturn:
        tries.append(None)
        raise error
    return call


def _never_landed(_conn: Connection, _item: Item) -> Landing:
    return NOT_LANDED


def test_a_read_after_a_drop_pauses_before_each_try_and_raises_the_last_drop(
    db: Database, paused: list[float]
) -> None:
    tries: list[None] = []
    last = _dropped()
    drops = [_dropped(), _dropped(), last]

    def read(_conn: Connection) -> NoReturn:
        tries.append(None)
        raise drops[len(tries) - 1]

    with pytest.raises(OperationalError) as raised:
        read_after_drop(db, read)
    assert raised.value is last
    assert (len(tries), paused) == (3, list(PAUSES))


def test_a_read_after_a_drop_answers_from_the_first_try_not_dropped(
    db: Database, paused: list[float]
) -> None:
    tries: list[None] = []

    def read(conn: Connection) -> int:
        tries.append(None)
        if len(tries) == 1:
            raise _dropped()
        return int(conn.execute(text("SELECT 7")).scalar_one())

    assert read_after_drop(db, read) == 7
    assert (len(tries), paused) == (2, list(PAUSES[:2]))


def test_a_read_after_a_drop_raises_any_other_error_at_once(
    db: Database, paused: list[float]
) -> None:
    tries: list[None] = []
    with pytest.raises(OperationalError, match="database is locked"):
        read_after_drop(db, _raising(_locked(), tries))
    assert (len(tries), paused) == (1, list(PAUSES[:1]))


def test_a_write_tries_at_once_then_after_each_pause_and_raises_the_last_drop(
    db: Database, paused: list[float]
) -> None:
    tries: list[None] = []
    with pytest.raises(OperationalError):
        write_through_drops(db, [Item("t")], _raising(_dropped(), tries), _never_landed)
    assert (len(tries), paused) == (1 + len(PAUSES), list(PAUSES))


def test_a_write_whose_landing_cannot_be_read_raises_its_drop_at_once(
    db: Database, paused: list[float]
) -> None:
    tries: list[None] = []
    with pytest.raises(OperationalError):
        write_through_drops(db, [Item("t")], _raising(_dropped(), tries), None)
    assert (len(tries), paused) == (1, [])


def test_a_write_raises_any_other_error_at_once_even_on_a_redo(
    db: Database, paused: list[float]
) -> None:
    """The first try dropped, the redo met another error: raised then, no more tries."""
    tries: list[None] = []

    def write_all(items: Sequence[Item]) -> list[Exception | None]:
        tries.append(None)
        raise _dropped() if len(tries) == 1 else _locked()

    with pytest.raises(OperationalError, match="database is locked"):
        write_through_drops(db, [Item("t")], write_all, _never_landed)
    assert (len(tries), paused) == (2, list(PAUSES[:1]))
