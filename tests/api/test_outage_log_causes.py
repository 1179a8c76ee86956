"""The line an API process logs when it answers `503 store_unavailable` says what kind
of outage it is, not only the driver's error class: a server refusing connections
(too many) is told from one that is down, a session an administrator ended from a lost
network. The SQLSTATE and fixed words; never the driver's message (it may quote a
statement's data: a prompt)."""

from __future__ import annotations

import logging
import secrets

import psycopg
import pytest
from sqlalchemy import literal, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import handlers.errors
from core.settings import Settings
from core.store.connect import open_database
from handlers.errors import problem_of
from tests.databases import pg_admin_conninfo

PROMPT = "SECRET-PROMPT-h2"


def _answered(exc: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    """The log of the 503 `problem_of` answers `exc` with."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taskward.http"):
        assert problem_of(exc).status_code == 503  # type: ignore[arg-type]
    return caplog.text


def test_a_503s_log_line_names_the_sqlstate_and_no_statement_data(
    pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers.errors, "_OUTAGE_ANSWERS", {})  # no earlier outage's tally
    role = f"tw_h2_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        full = open_database(Settings(database_url=make_url(pg_url).set(
            username=role).render_as_string(hide_password=False)))
        with pytest.raises(OperationalError) as refused, full.read():
            pass
        full.dispose()
        logged = _answered(refused.value, caplog)
        assert ("store unavailable (OperationalError): requests are answered 503 "
                "store_unavailable; the server refused the connection: SQLSTATE 53300 "
                "(too many connections)") in logged, logged
        assert role not in logged
    finally:
        with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")

    db = open_database(Settings(database_url=pg_url))
    try:
        with pytest.raises(OperationalError) as ended, db.read() as conn:
            driver = conn.connection.dbapi_connection
            assert driver is not None
            with psycopg.connect(pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [driver.info.backend_pid])
            conn.execute(select(literal(PROMPT)))
    finally:
        db.dispose()
    logged = _answered(ended.value, caplog)
    assert ("store unavailable (AdminShutdown): requests are answered 503 store_unavailable; "
            "SQLSTATE 57P01 (session ended by an administrator)") in logged, logged
    assert PROMPT not in logged
