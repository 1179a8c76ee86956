"""Concurrent upgrades of a new PostgreSQL database take turns even when a DBA set
`lock_timeout` and `statement_timeout` on the database: the waits for the advisory lock
were cut at 200 ms and 3 of 4 `taskward migrate` failed as a store outage."""

from __future__ import annotations

import threading

import psycopg
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.store.connect import open_database
from infra.migrate import head_revision, upgrade
from tests.databases import pg_admin_conninfo, private_pg_database

_UPGRADES = 3


def test_concurrent_upgrades_take_turns_despite_a_dbas_timeouts() -> None:
    with private_pg_database() as url:
        name = make_url(url).database
        with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'")
            admin.execute(f"ALTER DATABASE \"{name}\" SET statement_timeout = '1s'")
        # Each upgrade holds the lock well past the others' 200 ms bound on waiting.
        start = threading.Barrier(_UPGRADES)
        outcomes: list[object] = []

        def migrate() -> None:
            db = open_database(Settings(database_url=url))
            try:
                start.wait()
                outcomes.append(upgrade(db.engine))
            except Exception as exc:  # recorded for the assertion below
                outcomes.append(exc)
            finally:
                db.dispose()

        threads = [threading.Thread(target=migrate) for _ in range(_UPGRADES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert outcomes == [head_revision()] * _UPGRADES
