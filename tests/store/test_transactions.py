"""Transactions as `Database` begins them: a read is one snapshot on both stores (on
PostgreSQL by asking for REPEATABLE READ); on SQLite a write's `BEGIN IMMEDIATE` through
SQLAlchemy, a read's `BEGIN` on the driver itself (no lock to wait for, and a third of
a read transaction's CPU saved), which still starts a real transaction and fails as
SQLAlchemy's errors do."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from core.store.database import Database
from core.store.outage import is_connection_lost
from core.tables import tasks
from tests.store.helpers import new_task


def test_a_read_sees_one_snapshot_while_another_connection_commits(
    db: Database, model_id: str
) -> None:
    new_task(db, model_id)
    count = select(func.count()).select_from(tasks)
    with db.read() as conn:
        before = conn.execute(count).scalar_one()
        new_task(db, model_id)  # committed on another connection meanwhile
        during = conn.execute(count).scalar_one()
    with db.read() as conn:
        after = conn.execute(count).scalar_one()
    assert (before, during, after) == (1, 1, 2)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_read_whose_begin_fails_raises_sqlalchemys_error(db: Database) -> None:
    with db.engine.connect() as conn:
        conn.connection.driver_connection.execute("BEGIN")  # type: ignore[union-attr]
        with pytest.raises(OperationalError, match="within a transaction"):
            conn.begin()
        conn.connection.driver_connection.execute("ROLLBACK")  # type: ignore[union-attr]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_event_write_whose_session_ends_mid_transaction_raises_the_drivers_error(
    db: Database, model_id: str
) -> None:
    """The server ends the session under a statement of `write_events` (an administrator's
    `pg_terminate_backend`): the caller hears that error, which says the connection was
    lost (`core.store.outage.is_connection_lost`, what a worker redoes its write on),
    not SQLAlchemy's complaint about the rolled-back transaction's leftovers."""
    task_id = new_task(db, model_id)
    with pytest.raises(OperationalError) as raised, db.write_events() as conn:
        pid = conn.execute(select(func.pg_backend_pid())).scalar_one()
        with db.engine.connect() as other:
            other.execute(select(func.pg_terminate_backend(pid)))
        conn.execute(select(tasks.c.id).where(tasks.c.id == task_id))
    assert is_connection_lost(raised.value)
