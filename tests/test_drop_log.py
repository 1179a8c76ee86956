"""A connection the store drops (an administrator's `pg_terminate_backend`, a pooler's
restart) is one line in a sweeper's log, saying what happened and what it does next,
with no traceback: the claimer and the LISTEN connection each make a fresh one at once
(docs/operations.md, "Faults and recovery"). Before, each drop was logged as the first
failure of an outage, with its whole traceback, and a second line when the call worked
again. A store that cannot be reached is still an outage, logged as one
(tests/store/test_outage_logs.py)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from core.clock import Clock
from core.settings import Settings
from core.states import Status
from core.store import listener as listener_module
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.store.listener import PgListener
from core.store.outage import drop_cause, is_connection_dropped, is_connection_lost
from scheduler import loop as loop_module
from scheduler import timer as timer_module
from scheduler.loop import SweeperLoop
from scheduler.timer import MaintenanceTimer
from tests.scheduler.processes import wait_until
from tests.store.helpers import Hearing, new_task, task_row


def _terminate(db: Database, pid: int) -> None:
    """End backend `pid` as an administrator does, and wait until it is gone."""
    with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def _terminate_when_drawn(db: Database, armed: threading.Event, thread: str) -> list[int]:
    """Once `armed`, the next connection `thread` draws from the pool has its backend
    ended before its statement: that statement meets the drop. The pids ended."""
    ended: list[int] = []

    def terminate(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if armed.is_set() and threading.current_thread().name == thread:
            armed.clear()
            ended.append(dbapi_connection.info.backend_pid)
            _terminate(db, ended[-1])

    event.listen(db.engine, "checkout", terminate)
    return ended


def _one_line_each(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """What `logger` said at WARNING or above; and that nothing logged a traceback."""
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    return [r.getMessage() for r in caplog.records
            if r.name == logger and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no server
def test_a_claim_whose_connection_is_dropped_is_one_line_and_claims_again_at_once(
        db: Database, settings: Settings, model_id: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    armed = threading.Event()
    ended = _terminate_when_drawn(db, armed, "claimer")
    loop = SweeperLoop(db, replace(settings, engine_modules="tests.engines"))
    loop.start()
    try:
        before = new_task(db, model_id)
        wait_until(lambda: task_row(db, before).status == Status.COMPLETED, timeout=10,
                   what="a task before the drop")
        armed.set()
        after = new_task(db, model_id)
        wait_until(lambda: task_row(db, after).status == Status.COMPLETED, timeout=10,
                   what="a task claimed through the drop")
    finally:
        loop.stop()
    assert len(ended) == 1
    assert _one_line_each(caplog, loop_module.__name__) == [
        "claim: the store dropped the connection: SQLSTATE 57P01 (session ended by an "
        "administrator); claiming again at once on a fresh one"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: no server
def test_a_dropped_listen_connection_is_one_line_and_listens_again_at_once(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=listener_module.__name__)
    hearing = Hearing()
    heard, connected = hearing.heard, hearing.connected

    listening = PgListener(libpq_conninfo(db.engine), {"probe": hearing})
    listening.start()
    try:
        assert connected.wait(10)
        connected.clear()
        with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as admin:
            [(pid,)] = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND query = 'LISTEN probe'").fetchall()
        _terminate(db, pid)
        assert connected.wait(10), "the listener never listened again"
        with psycopg.connect(libpq_conninfo(db.engine), autocommit=True) as conn:
            conn.execute("NOTIFY probe, 'after the drop'")
        wait_until(lambda: "after the drop" in heard, timeout=10,
                   what="a notification after the drop")
    finally:
        listening.stop()
    [line] = _one_line_each(caplog, listener_module.__name__)
    assert line.startswith("LISTEN: the store dropped the connection: ")
    assert line.endswith("; listening again at once on a fresh one")


def test_a_drop_is_told_by_its_sqlstate_and_from_a_store_that_cannot_be_reached() -> None:
    """The SQLSTATE may be on the error the driver's was raised while handling (its
    rollback after the server's 57P01); a connection never made is no drop."""
    lost = psycopg.OperationalError("the connection is lost")
    lost.__context__ = psycopg.errors.AdminShutdown("terminating connection")
    dropped = OperationalError("ROLLBACK", None, lost)
    assert is_connection_dropped(dropped)
    assert drop_cause(dropped) == "SQLSTATE 57P01 (session ended by an administrator)"
    refused = OperationalError(None, None, psycopg.OperationalError(
        "connection failed: connection to server at \"127.0.0.1\", port 5432 failed: "
        "Connection refused"))
    assert is_connection_lost(refused) and not is_connection_dropped(refused)


def test_a_maintenance_pass_whose_connection_is_dropped_is_one_line_and_runs_again_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """The pass met the drop (as the claimer's test above makes one); a second failure in
    a row is an outage, logged as one with its traceback."""
    caplog.set_level(logging.INFO, logger=timer_module.__name__)
    lost = psycopg.OperationalError("the connection is lost")
    lost.__context__ = psycopg.errors.AdminShutdown("terminating connection")
    dropped = OperationalError("UPDATE", None, lost)
    failures: list[Exception] = []
    passes: list[int] = []

    def maintain() -> None:
        passes.append(len(passes))
        if failures:
            raise failures.pop()

    timer = MaintenanceTimer("* * * * *", Clock(), maintain)
    failures.append(dropped)
    assert timer.poll()
    assert passes == [0, 1]
    said = ("maintenance: the store dropped the connection: SQLSTATE 57P01 (session ended "
            "by an administrator); running the pass again at once on a fresh one")
    assert _one_line_each(caplog, timer_module.__name__) == [said]

    caplog.clear()
    failures.extend([dropped, dropped])
    MaintenanceTimer("* * * * *", Clock(), maintain).poll()
    assert passes == [0, 1, 2, 3]
    [outage] = [r for r in caplog.records if r.exc_info]
    assert outage.getMessage().startswith("maintenance pass failed (OperationalError, 1 in a row)")
    assert [r.getMessage() for r in caplog.records if not r.exc_info] == [said]
