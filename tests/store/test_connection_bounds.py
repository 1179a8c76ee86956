"""The bounds `TASKWARD_STORE_WAIT_SECONDS` puts on every PostgreSQL connection
(`core.store.libpq`), and the URL's own settings beside them.

A taskward process stopped (SIGSTOP, a paused VM) or cut off in the middle of a
transaction holds that transaction's row locks for as long as the server keeps its
session: lease expiry, cancels and every other writer of its tasks wait behind them.
The server ends a session left idle inside a transaction for the bound. Here the
stopped process is a thread of this one, held inside `Database.write` on a connection
of taskward's own engine; the server and the locks are real. (A vanished host is
`test_network_partition.py`.)"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import pytest
from sqlalchemy import event, text, update
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.states import Status
from core.store import claims
from core.store.connect import open_database
from core.store.pg_async import AutocommitConnections
from core.store.recovery import expire_leases
from core.tables import tasks
from handlers.threads import store_unavailable
from tests.store.helpers import new_task, task_row

WAIT_SECONDS = 2
SLACK_SECONDS = 3  # a loaded machine's scheduling on top of the bound
LEASE_MS = 500


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_transaction_a_stopped_worker_left_open_holds_its_task_only_within_the_bound(
    settings: Settings, model_id: str
) -> None:
    """The hold is timed from the sweeper's start to the moment its last statement got
    through, the row free by then; not to the end of its own COMMIT, whose WAL flush a
    machine busy writing (a build, another test's CREATE/DROP DATABASE) stretched by
    seconds, nor over its engine's first connection: the sweeper has its connection
    and its statements before it is timed."""
    bounded = dataclasses.replace(settings, store_wait_seconds=WAIT_SECONDS)
    worker, sweeper = open_database(bounded), open_database(bounded)
    try:
        task = new_task(worker, model_id)
        assert expire_leases(sweeper)["queued"] == 0  # nothing leased yet: warms it up
        answered: list[float] = []
        event.listen(sweeper.engine, "after_cursor_execute",
                     lambda *_: answered.append(time.monotonic()))
        assert claims.claim(worker, limit=1, lease_ms=LEASE_MS, node_id="node-a")
        holding, go_on = threading.Event(), threading.Event()
        raised: list[BaseException] = []

        def stopped_mid_transaction() -> None:
            try:
                with worker.write() as conn:
                    conn.execute(update(tasks).where(tasks.c.id == task)
                                 .values(lease_expires_at=tasks.c.lease_expires_at))
                    holding.set()
                    go_on.wait(10 * WAIT_SECONDS)  # the process is stopped here
            except Exception as exc:
                raised.append(exc)

        stopped = threading.Thread(target=stopped_mid_transaction)
        stopped.start()
        assert holding.wait(10)
        time.sleep(LEASE_MS / 1000 + 0.2)  # the lease runs out unrenewed
        started = time.monotonic()
        expired = expire_leases(sweeper)  # waits on the row lock until the session ends
        waited = answered[-1] - started
        go_on.set()
        stopped.join(10)

        assert waited <= WAIT_SECONDS + SLACK_SECONDS
        assert not stopped.is_alive()
        assert expired["queued"] == 1
        assert task_row(sweeper, task).status == Status.QUEUED
        # The stopped writer, once it goes on, hears the store's error: not committed,
        # and what the API answers 503 store_unavailable.
        [error] = raised
        assert store_unavailable(error), repr(error)
    finally:
        worker.dispose()
        sweeper.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_urls_own_connection_settings_are_kept_beside_the_bounds(settings: Settings) -> None:
    """An operator's `options` (here a statement timeout) and a libpq timeout of their
    own in `TASKWARD_DATABASE_URL` win over, or sit beside, what taskward adds, on the
    pool's connections and on those made without SQLAlchemy (the API's batches)."""
    url = make_url(settings.database_url).update_query_dict(
        {"options": "-c statement_timeout=7000", "keepalives_idle": "60"})
    db = open_database(dataclasses.replace(settings, database_url=url.render_as_string(
        hide_password=False), store_wait_seconds=WAIT_SECONDS))
    try:
        with db.read() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "7s"
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")
                                ).scalar_one() == f"{WAIT_SECONDS}s"
            driver = conn.connection.dbapi_connection
            assert driver is not None
            libpq = driver.info.get_parameters()
        assert (libpq["keepalives_idle"], libpq["tcp_user_timeout"]) == (
            "60", str(WAIT_SECONDS * 1000))

        async def batch_connection_settings() -> Any:
            batches = AutocommitConnections(db)
            try:
                return await batches.first_row(
                    "SELECT current_setting('statement_timeout')", {})
            finally:
                await batches.close()

        # In autocommit, never holding a transaction: no idle-transaction bound needed.
        assert tuple(asyncio.run(batch_connection_settings())) == ("7s",)
    finally:
        db.dispose()
