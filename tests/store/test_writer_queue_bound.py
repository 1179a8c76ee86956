"""The SQLite writers' queue (`Database.write_turn`) waits no longer than the busy timeout.

The queue sits in front of SQLite's write lock, so its wait is part of the wait the
busy timeout bounds: a writer with a short timeout, queued behind another process
whose writes wait their own (longer) timeout for SQLite's lock, answers unavailable
within its own timeout, as SQLite's busy handler would have, and its turn given up
leaves the queue free for the others."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from core.settings import Settings
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.outage import is_store_outage, outage_cause

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

ROOT = Path(__file__).resolve().parents[2]
BUSY_TIMEOUT = 0.5  # seconds, the writer's under test
# Another taskward process: holds its turn until told (a line) or for at most argv[2]
# seconds, so that a writer the queue does not bound fails its test instead of hanging.
HOLDER = """
import select, sys
from core.settings import Settings
from core.store.connect import create_db_engine
from core.store.database import Database
db = Database(create_db_engine(Settings(database_url=sys.argv[1])))
with db.write_turn():
    print("held", flush=True)
    select.select([sys.stdin], [], [], float(sys.argv[2]))
"""


@pytest.fixture
def writer(database_url: str) -> Iterator[Database]:
    """A writer whose busy timeout is `BUSY_TIMEOUT`."""
    db = Database(create_db_engine(Settings(database_url=database_url,
                                            sqlite_busy_timeout_ms=int(BUSY_TIMEOUT * 1000))))
    yield db
    db.dispose()


@contextmanager
def turn_held_elsewhere(database_url: str, at_most: float = 10) -> Iterator[None]:
    """Another process holds its turn to write until the block ends (or `at_most` s)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, database_url, str(at_most)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.stdin.close()  # its turn ends
        holder.wait(30)


def timed_failed_write(db: Database) -> tuple[float, OperationalError]:
    """How long a write waited before it failed, and its error."""
    started = time.monotonic()
    with pytest.raises(OperationalError) as failed:
        with db.write() as conn:
            conn.execute(text("SELECT 1"))
    return time.monotonic() - started, failed.value


def assert_failed_as_sqlite_busy(waited: float, error: OperationalError) -> None:
    """Failed after about the busy timeout, as SQLite's own busy wait fails: an outage."""
    assert BUSY_TIMEOUT * 0.9 <= waited < 3 * BUSY_TIMEOUT + 1
    assert is_store_outage(error)
    assert "database is locked" in str(error)
    assert error.orig is not None and outage_cause(error.orig) == "SQLITE_BUSY"


def taken_elsewhere(lock_file: str) -> bool:
    """Whether another open file description (as another process has) takes the
    queue's `flock` and lets go of it within 10 s."""
    descriptor = os.open(lock_file, os.O_RDWR)

    def take_and_let_go() -> None:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)

    taker = threading.Thread(target=take_and_let_go, daemon=True)
    taker.start()
    taker.join(10)
    return not taker.is_alive()


def test_a_writer_waits_for_another_processes_turn_no_longer_than_its_busy_timeout(
    writer: Database, database_url: str
) -> None:
    with turn_held_elsewhere(database_url):
        waited, error = timed_failed_write(writer)

    assert_failed_as_sqlite_busy(waited, error)


def test_a_writer_waits_for_another_threads_turn_no_longer_than_its_busy_timeout(
    writer: Database,
) -> None:
    held, done = threading.Event(), threading.Event()

    def hold_the_turn() -> None:
        with writer.write_turn():
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    try:
        assert held.wait(10)
        waited, error = timed_failed_write(writer)
    finally:
        done.set()
        holder.join(10)

    assert_failed_as_sqlite_busy(waited, error)


def test_a_turn_given_up_leaves_the_queue_free_for_the_other_processes(
    writer: Database, database_url: str
) -> None:
    """The lock this process's wait was still asking for when the writer gave up is
    let go as soon as it comes, and the next writer's turn is let go in its turn."""
    lock_file = writer.beside("writer-lock")
    assert lock_file is not None
    with turn_held_elsewhere(database_url):
        timed_failed_write(writer)

    assert taken_elsewhere(lock_file)
    with writer.write() as conn:
        conn.execute(text("CREATE TABLE after_giving_up (x INTEGER)"))
    assert taken_elsewhere(lock_file)


def test_a_turn_waited_for_is_still_taken_once_by_a_nested_write(database_url: str) -> None:
    """A writer (default busy timeout) queued behind another process gets the turn when
    the other lets go, and a write inside its turn takes no second turn."""
    db = Database(create_db_engine(Settings(database_url=database_url)))
    try:
        with turn_held_elsewhere(database_url, at_most=0.5):
            with db.write_turn():
                with db.write() as conn:
                    conn.execute(text("CREATE TABLE nested (x INTEGER)"))
                with db.write() as conn:
                    conn.execute(text("INSERT INTO nested VALUES (1)"))
        with db.read() as conn:
            assert conn.execute(text("SELECT x FROM nested")).scalars().all() == [1]
    finally:
        db.dispose()
