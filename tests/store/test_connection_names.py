"""Every PostgreSQL connection a taskward process opens says which process it serves
(`application_name` taskward-<role>): a DBA reading `pg_stat_activity` tells the API's
sessions from a sweeper's or a CLI command's. The pool's, the LISTEN connection's and
the API's batch connections alike; an operator's own name in the URL is kept."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any, get_args

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from core.settings import Settings
from core.store.connect import ProcessRole, open_database
from core.store.database import Database
from core.store.pg_async import AutocommitConnections

_NAME = text("SELECT current_setting('application_name')")
_LISTENER_NAME = text("SELECT application_name FROM pg_stat_activity "
                      "WHERE pid <> pg_backend_pid() AND query LIKE 'LISTEN %'"
                      " AND datname = current_database()")


def _batch_connection_name(db: Database) -> Any:
    async def named() -> Any:
        batches = AutocommitConnections(db)
        try:
            return (await batches.first_row("SELECT current_setting('application_name')",
                                            {}))[0]
        finally:
            await batches.close()

    return asyncio.run(named())


def _listener_name(db: Database) -> list[str]:
    heard = threading.Event()
    listener = db.listener({"tw_h2_names": lambda _payload: heard.set()})
    assert listener is not None
    listener.start()
    try:
        assert heard.wait(10)  # called once LISTEN is in place
        with db.read() as conn:
            return list(conn.execute(_LISTENER_NAME).scalars())
    finally:
        listener.stop()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_each_process_role_names_every_connection_it_opens(settings: Settings) -> None:
    for role in get_args(ProcessRole):
        db = open_database(settings, role=role)
        try:
            with db.read() as conn:
                assert conn.execute(_NAME).scalar_one() == f"taskward-{role}"
            assert _batch_connection_name(db) == f"taskward-{role}"
            if role == "sweeper":  # one LISTEN connection is enough to see it named
                assert _listener_name(db) == ["taskward-sweeper"]
        finally:
            db.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_application_name_in_the_url_is_the_operators(settings: Settings) -> None:
    url = make_url(settings.database_url).update_query_dict({"application_name": "ours"})
    db = open_database(dataclasses.replace(
        settings, database_url=url.render_as_string(hide_password=False)), role="sweeper")
    try:
        with db.read() as conn:
            assert conn.execute(_NAME).scalar_one() == "ours"
        assert _batch_connection_name(db) == "ours"
    finally:
        db.dispose()
