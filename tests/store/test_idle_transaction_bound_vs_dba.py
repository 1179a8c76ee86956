"""taskward bounds how long a session of its pool may sit idle inside a transaction
(`idle_in_transaction_session_timeout`, from `TASKWARD_STORE_WAIT_SECONDS`), but a
DBA's stricter bound on the database or role is kept: it was overridden by a start-up
option, which outranks `ALTER DATABASE/ROLE ... SET`."""

from __future__ import annotations

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.store.connect import open_database
from tests.databases import pg_admin_conninfo, private_pg_database

WAIT_SECONDS = 3  # taskward's bound: 3s


def test_the_stricter_of_the_dbas_bound_and_taskwards_is_kept() -> None:
    with private_pg_database() as url:
        name = make_url(url).database
        # The DBA's setting on the database -> what a new connection of taskward's has.
        for dbas, kept in (("1s", "1s"), ("10s", "3s"), ("0", "3s")):
            with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE \"{name}\" SET "
                              f"idle_in_transaction_session_timeout = '{dbas}'")
            db = open_database(Settings(database_url=url, store_wait_seconds=WAIT_SECONDS))
            try:
                with db.write() as conn:  # a writer's transaction: what the bound guards
                    bound = conn.execute(text("SHOW idle_in_transaction_session_timeout"))
                    assert (dbas, bound.scalar_one()) == (dbas, kept)
            finally:
                db.dispose()


def test_the_operators_own_bound_in_the_urls_options_is_kept_however_spelled() -> None:
    """The server reads a setting's name in any case and with `-` for `_`: each of these
    options sets the bound, and taskward leaves it as the operator chose (0: none)."""
    with private_pg_database() as url:
        for option in ("-c idle_in_transaction_session_timeout=0",
                       "-c idle-in-transaction-session-timeout=0",
                       "-c IDLE_IN_TRANSACTION_SESSION_TIMEOUT=0",
                       "--Idle-In-Transaction-Session-Timeout=0"):
            with_option = make_url(url).update_query_dict({"options": option})
            db = open_database(Settings(database_url=with_option.render_as_string(False),
                                        store_wait_seconds=WAIT_SECONDS))
            try:
                with db.write() as conn:
                    bound = conn.execute(text("SHOW idle_in_transaction_session_timeout"))
                    assert (option, bound.scalar_one()) == (option, "0")
            finally:
                db.dispose()
