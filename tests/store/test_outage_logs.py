"""A store outage in the logs of the loops that retry through it (`core.failure_streak`):
each says when its failures start (with the traceback, once), reminds the operator now
and then while they last, and says when its call works again; each attempt it cuts off
is one line. Each loop also recovers
by itself: the outages here are a private PostgreSQL cluster stopped and started."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from freezegun import freeze_time
from sqlalchemy.exc import OperationalError

import tests.engines  # noqa: F401  registers the deterministic engine in this process
from core import failure_streak
from core.clock import Clock
from core.settings import Settings
from core.states import Status
from core.store import listener as listener_module
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.listener import PgListener
from core.store.outage import outage_behind
from core.store.tasks import cancel
from handlers import live
from handlers.live import LiveTail
from scheduler import loop as loop_module
from scheduler import timer as timer_module
from scheduler import workers as workers_module
from scheduler.group_commit import write_failed
from scheduler.loop import SweeperLoop
from scheduler.timer import MaintenanceTimer
from tests.pg_cluster import PgCluster, migrated_cluster, private_cluster
from tests.scheduler.processes import wait_until
from tests.store.helpers import Hearing, new_task, task_row

REMINDER = 10  # failures per reminder here: a few seconds of outage show two


@pytest.fixture(autouse=True)
def frequent_reminders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failure_streak, "FAILURES_PER_REMINDER", REMINDER)


def test_the_listener_logs_an_outage_sparingly_and_hears_again_after_it(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener_module, "_RECONNECT_SECONDS", 0.1)
    hearing = Hearing()
    heard, connected = hearing.heard, hearing.connected

    caplog.set_level(logging.INFO, logger=listener_module.__name__)
    with private_cluster() as cluster:
        listening = PgListener(cluster.conninfo, {"probe": hearing})
        listening.start()
        try:
            assert connected.wait(10)
            cluster.stop()
            connected.clear()
            # ~10 reconnects a second while the server is down
            wait_until(lambda: REMINDER + 1 in streak_logged(caplog, "LISTEN failed"),
                       timeout=20, what="the first reminder")

            cluster.start()
            assert connected.wait(10), "the listener never reconnected"
            with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
                conn.execute("NOTIFY probe, 'after the outage'")
            wait_until(lambda: "after the outage" in heard, timeout=10,
                       what="a notification after the outage")
        finally:
            listening.stop()
    assert_logged_sparingly(caplog, "LISTEN failed", "LISTEN is back", logging.WARNING)


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with migrated_cluster() as started:
        yield started


@pytest.fixture
def database_url(cluster: PgCluster) -> str:
    """`settings`, `db` and `model_id` over the private cluster."""
    return cluster.url


def test_the_claimer_logs_an_outage_sparingly_and_claims_again_after_it(
        cluster: PgCluster, db: Database, settings: Settings, model_id: str,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, each failed claim (one a second) logged its whole traceback: a
    20-second outage wrote 1,400 lines to one sweeper's log."""
    monkeypatch.setattr(loop_module, "_ERROR_PAUSE_SECONDS", 0.05)
    caplog.set_level(logging.INFO, logger=loop_module.__name__)
    loop = SweeperLoop(db, replace(settings, engine_modules="tests.engines",
                                   poll_interval_ms=20))
    loop.start()
    try:
        before = new_task(db, model_id)
        wait_until(lambda: task_row(db, before).status == Status.COMPLETED, timeout=10,
                   what="a task before the outage")
        cluster.stop()
        wait_until(lambda: REMINDER + 1 in streak_logged(caplog, "claim failed"),
                   timeout=20, what="the first reminder")
        cluster.start()
        wait_until(lambda: back_logged(caplog, "claims are back"), timeout=20,
                   what="the claims' return")
        after = new_task(db, model_id)
        wait_until(lambda: task_row(db, after).status == Status.COMPLETED, timeout=10,
                   what="a task after the outage")
    finally:
        loop.stop()
    assert_logged_sparingly(caplog, "claim failed", "claims are back", logging.ERROR)


def test_an_attempt_the_outage_cuts_off_is_abandoned_in_one_line(
        cluster: PgCluster, db: Database, settings: Settings, model_id: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every attempt in flight meets the outage at once: one line each, where each
    was a traceback of some sixty lines."""
    caplog.set_level(logging.INFO, logger=workers_module.log.name)
    loop = SweeperLoop(db, replace(settings, engine_modules="tests.engines",
                                   poll_interval_ms=20))
    loop.start()
    try:
        streaming = new_task(db, model_id, input="words=1000 delay=0.02")
        wait_until(lambda: task_row(db, streaming).status == Status.RUNNING, timeout=10,
                   what="the attempt streaming")
        cluster.stop()
        wait_until(lambda: abandoned(caplog), timeout=20, what="the attempt abandoned")
        cluster.start()
    finally:
        loop.stop()
    [line] = abandoned(caplog)
    assert line.getMessage() == (
        f"task {streaming}: attempt abandoned, the store is unavailable (OperationalError); "
        "its lease runs out and its restart policy applies")
    assert line.levelno == logging.ERROR and line.exc_info is None


def abandoned(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in list(caplog.records) if "attempt abandoned" in r.getMessage()]


def test_a_group_writes_failure_is_an_outage_when_its_write_met_one() -> None:
    down = OperationalError("COMMIT", {}, Exception("the connection is lost"))
    assert outage_behind(write_failed(down)) is down
    assert outage_behind(down) is down
    assert outage_behind(write_failed(ValueError("a bug"))) is None


def test_the_live_tail_logs_an_outage_sparingly_and_wakes_its_waiter_after_it(
        cluster: PgCluster, db: Database, settings: Settings, model_id: str,
        caplog: pytest.LogCaptureFixture) -> None:
    task_id = new_task(db, model_id, run_at=2**60)  # stays queued: nothing claims it
    caplog.set_level(logging.INFO, logger=live.log.name)
    tail = LiveTail(db, interval_seconds=0.05)
    elsewhere = Database(create_db_engine(settings))  # its commits are not heard here

    async def wait_through_an_outage() -> bool:
        await tail.start()
        try:
            waiting = asyncio.ensure_future(tail.wait(task_id, 1, 60))
            await asyncio.to_thread(cluster.stop)
            while REMINDER + 1 not in streak_logged(caplog, "live tail poll failed"):
                await asyncio.sleep(0.05)
            await asyncio.to_thread(cluster.start)
            await asyncio.to_thread(cancel, elsewhere, task_id, None)
            return await asyncio.wait_for(waiting, 20)  # only a poll can wake it
        finally:
            await tail.stop()

    try:
        assert asyncio.run(wait_through_an_outage()) is True
    finally:
        elsewhere.dispose()
    assert_logged_sparingly(caplog, "live tail poll failed", "live tail polls are back",
                            logging.WARNING)


def test_the_maintenance_timer_logs_each_failing_pass_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its passes come once a slot, so here under a frozen clock; what fails is the
    pass it was given."""
    outage = True

    def maintain() -> None:
        if outage:
            raise OSError("store down")

    caplog.set_level(logging.INFO, logger=timer_module.log.name)
    with freeze_time("2026-03-01 12:00:30") as frozen:
        timer = MaintenanceTimer("* * * * *", Clock(), maintain)
        for _ in range(2 * REMINDER + 1):
            assert timer.poll()
            frozen.tick(60)
        outage = False
        assert timer.poll()
        frozen.tick(60)
        assert timer.poll()
    failed = "maintenance pass failed (OSError, %d in a row); retrying at the next slot"
    # One line a slot (a minute): the first with its traceback. The reminder every
    # REMINDER failures of the loops that retry each second was one an hour here.
    assert [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        (logging.ERROR, failed % 1, True),
        *((logging.ERROR, failed % n, False) for n in range(2, 2 * REMINDER + 2)),
        (logging.INFO, "maintenance passes are back after 21 failed attempts", False),
    ]


def streak_logged(caplog: pytest.LogCaptureFixture, failed: str) -> list[int]:
    """The failures-in-a-row count of each `failed (Class, N in a row)` line, in order."""
    pattern = re.compile(re.escape(failed) + r" \(\w+, (\d+) in a row\)")
    return [int(match.group(1)) for record in list(caplog.records)
            if (match := pattern.match(record.getMessage()))]


def back_logged(caplog: pytest.LogCaptureFixture, back: str) -> list[logging.LogRecord]:
    return [r for r in list(caplog.records) if r.getMessage().startswith(back)]


def assert_logged_sparingly(caplog: pytest.LogCaptureFixture, failed: str, back: str,
                            level: int) -> None:
    """The first failure with its traceback, then every REMINDER-th without, all at
    `level`; one line at INFO when the call worked again."""
    logged = streak_logged(caplog, failed)
    assert logged == list(range(1, logged[-1] + 1, REMINDER)), caplog.text
    lines = [r for r in caplog.records if r.getMessage().startswith(failed)]
    assert {r.levelno for r in lines} == {level}
    assert [r.exc_info is not None for r in lines] == [True] + [False] * (len(lines) - 1)
    [ended] = back_logged(caplog, back)
    assert ended.levelno == logging.INFO
    failures = re.search(r"after (\d+) failed attempts$", ended.getMessage())
    assert failures and logged[-1] <= int(failures[1]) < logged[-1] + REMINDER


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def logged_tally(caplog: pytest.LogCaptureFixture,
                 clock: FakeMonotonic) -> failure_streak.FailureTally:
    caplog.set_level(logging.WARNING, logger="tally")
    return failure_streak.FailureTally(
        logging.getLogger("tally"), "out (%s)", "still out (%s): %d more", clock=clock)


def test_a_tally_logs_an_outages_first_failure_then_a_count_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeMonotonic()
    tally = logged_tally(caplog, clock)

    for _ in range(30):  # one a second for half a minute, then a minute's worth
        tally.failed(OperationalError("select", {}, ConnectionRefusedError()))
        clock.now += 1
    for _ in range(60):
        tally.failed(TimeoutError())
        clock.now += 1

    assert [r.getMessage() for r in caplog.records] == [
        "out (OperationalError)", "still out (TimeoutError): 60 more"]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_a_tally_takes_a_failure_after_a_quiet_minute_for_a_new_outage(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeMonotonic()
    tally = logged_tally(caplog, clock)

    tally.failed(TimeoutError())
    clock.now += 59
    tally.failed(TimeoutError())  # the same outage: counted, not logged
    clock.now += 60
    tally.failed(TimeoutError())  # a quiet minute before it: a new outage

    assert [r.getMessage() for r in caplog.records] == ["out (TimeoutError)"] * 2
