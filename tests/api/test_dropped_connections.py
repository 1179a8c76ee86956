"""An API request whose store call meets a connection the store dropped before it sent
a COMMIT (an administrator's `pg_terminate_backend`, a pooler's restart) is made once
more at once on a fresh connection, as the sweeper's loops do: it is answered, one
line is logged, and nothing is created twice (docs/operations.md, "Faults and
recovery"). A drop at a COMMIT may have landed: it is answered `503` as before, its
line naming the SQLSTATE the server ended the session with; so is a second drop in a
row. SQLite has no session to lose: its errors are never made again."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from litestar.testing import TestClient
from sqlalchemy import Connection, Engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import handlers.errors
import handlers.responses
import handlers.tasks
from core.quotas import Limits
from core.settings import Settings
from core.store import new_tasks
from core.store import tasks as store_tasks
from core.store.clients import create_client
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.tables import tasks
from handlers import enqueuing
from handlers.errors import problem_of
from tests.api.helpers import Caller

T = TypeVar("T")
POSTGRESQL = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
DROP_LINE = ("request: the store dropped the connection: SQLSTATE 57P01 (session ended by "
             "an administrator); making its store call again at once on a fresh one")


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """A short SQLite busy timeout: a locked store is answered within the test."""
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    return Settings(database_url=database_url, models_dir=models, node_id="node-a",
                    sqlite_busy_timeout_ms=200)


@pytest.fixture(autouse=True)
def no_earlier_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first 503 is logged: no tally of an earlier test's outage holds it."""
    monkeypatch.setattr(handlers.errors, "_OUTAGE_ANSWERS", {})


def _app_engine(http: TestClient[Any]) -> Engine:
    engine: Engine = http.app.state.services.db.engine
    return engine


def _terminate(engine: Engine, pid: int) -> None:
    """End backend `pid` as an administrator does, and wait until it is gone."""
    with psycopg.connect(libpq_conninfo(engine), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


class Dropping:
    """Ends the backend of the connection the store call `patched` draws from the app's
    pool (`at="checkout"`: before its first statement) or commits on (`at="commit"`:
    before its COMMIT is sent), on its first `calls` calls; counts every call."""

    def __init__(self, engine: Engine, *, at: str, calls: int = 1) -> None:
        self.engine = engine
        self.calls = 0
        self.ended: list[int] = []
        self._dropping_calls = calls
        self._armed: threading.Thread | None = None
        if at == "checkout":
            event.listen(engine, "checkout", self._at_checkout)
        else:
            event.listen(engine, "commit", self._at_commit)

    def patched(self, call: Callable[..., T]) -> Callable[..., T]:
        def counted(*args: Any, **kwargs: Any) -> T:
            self.calls += 1
            if self.calls <= self._dropping_calls:
                self._armed = threading.current_thread()
            return call(*args, **kwargs)

        return counted

    def _end(self, pid: int) -> None:
        if self._armed is threading.current_thread():
            self._armed = None
            self.ended.append(pid)
            _terminate(self.engine, pid)

    def _at_checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        self._end(dbapi_connection.info.backend_pid)

    def _at_commit(self, conn: Connection) -> None:
        driver = conn.connection.dbapi_connection
        assert driver is not None
        self._end(driver.info.backend_pid)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The API's lines at WARNING or above; and that none logged a traceback."""
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    return [r.getMessage() for r in caplog.records
            if r.name == "taskward.http" and r.levelno >= logging.WARNING]


def _create(who: Caller, model_id: str) -> str:
    answer = who.post("/v1/responses", json={"model": model_id, "input": "words=3"})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _tasks_of(db: Database, client_id: str) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(tasks)
                                .where(tasks.c.client_id == client_id)).scalar_one())


@POSTGRESQL
def test_a_read_whose_connection_is_dropped_is_made_again_and_answered(
    http: TestClient[Any], alice: Caller, model_id: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    task_id = _create(alice, model_id)
    dropping = Dropping(_app_engine(http), at="checkout")
    monkeypatch.setattr(handlers.responses, "get_response",
                        dropping.patched(store_tasks.get_response))
    caplog.set_level(logging.INFO)

    answer = alice.get(f"/v1/responses/{task_id}")

    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == task_id
    assert (len(dropping.ended), dropping.calls) == (1, 2)
    assert _warnings(caplog) == [DROP_LINE]


@POSTGRESQL
def test_a_creation_whose_connection_is_dropped_before_its_commit_is_made_once(
    http: TestClient[Any], db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client with `max_active_tasks` creates in a transaction of several statements
    (`core.store.new_tasks.enqueue`); its first statement meets the drop."""
    issued = create_client(db, name="capped", scopes=frozenset({"responses:create"}),
                           limits=Limits(max_active_tasks=5))
    capped = Caller(http, issued.token, issued.client_id)
    dropping = Dropping(_app_engine(http), at="checkout")
    monkeypatch.setattr(enqueuing, "enqueue", dropping.patched(new_tasks.enqueue))
    caplog.set_level(logging.INFO)

    answer = capped.post("/v1/responses", json={"model": model_id, "input": "words=3"},
                         headers={"Idempotency-Key": "made-once"})

    assert answer.status_code == 202, answer.text
    assert (len(dropping.ended), dropping.calls) == (1, 2)
    assert _tasks_of(db, capped.id) == 1
    assert _warnings(caplog) == [DROP_LINE]


@POSTGRESQL
def test_a_second_drop_in_a_row_is_answered_503_naming_the_sqlstate(
    http: TestClient[Any], alice: Caller, model_id: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    task_id = _create(alice, model_id)
    dropping = Dropping(_app_engine(http), at="checkout", calls=2)
    monkeypatch.setattr(handlers.responses, "get_response",
                        dropping.patched(store_tasks.get_response))
    caplog.set_level(logging.INFO)

    answer = alice.get(f"/v1/responses/{task_id}")

    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "store_unavailable"
    assert (len(dropping.ended), dropping.calls) == (2, 2)
    [drop, outage] = _warnings(caplog)
    assert drop == DROP_LINE
    assert outage.endswith("requests are answered 503 store_unavailable; SQLSTATE 57P01 "
                           "(session ended by an administrator)"), outage


@POSTGRESQL
def test_a_write_whose_commit_meets_the_drop_is_not_made_again(
    http: TestClient[Any], db: Database, alice: Caller, model_id: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The COMMIT may have landed with only its acknowledgement lost: answered `503`
    (the client may retry), never written a second time behind its back."""
    task_id = _create(alice, model_id)
    dropping = Dropping(_app_engine(http), at="commit")
    monkeypatch.setattr(handlers.tasks, "cancel", dropping.patched(store_tasks.cancel))
    caplog.set_level(logging.INFO)

    answer = alice.post(f"/v1/tasks/{task_id}/cancel")

    assert answer.status_code == 503, answer.text
    assert (len(dropping.ended), dropping.calls) == (1, 1)
    [outage] = _warnings(caplog)
    assert "requests are answered 503 store_unavailable; SQLSTATE 57P01" in outage, outage
    assert alice.post(f"/v1/tasks/{task_id}/cancel").status_code == 200  # the retry


@POSTGRESQL
def test_a_creation_whose_one_statement_commits_by_itself_is_not_made_again(
    http: TestClient[Any], db: Database, alice: Caller, model_id: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Births alone are one statement that commits by itself
    (`core.store.births.insert_rows_alone`): a drop under it is a drop at a COMMIT.
    Here on the writer thread, where a batch that failed on the event loop goes."""
    monkeypatch.setattr(enqueuing, "births_alone", lambda _db, _batch: False)
    dropping = Dropping(_app_engine(http), at="checkout")
    monkeypatch.setattr(enqueuing, "enqueue", dropping.patched(new_tasks.enqueue))
    caplog.set_level(logging.INFO)

    answer = alice.post("/v1/responses", json={"model": model_id, "input": "words=3"})

    assert answer.status_code == 503, answer.text
    assert (len(dropping.ended), dropping.calls) == (1, 1)
    [outage] = _warnings(caplog)
    assert "requests are answered 503 store_unavailable; SQLSTATE 57P01" in outage, outage


def test_a_503_for_a_lost_connection_names_the_sqlstate_the_session_ended_with(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's "the connection is lost" (raised by the rollback after the server's
    57P01) has no SQLSTATE of its own: the one before it is named."""
    lost = psycopg.OperationalError("the connection is lost")
    lost.__context__ = psycopg.errors.AdminShutdown("terminating connection")
    with caplog.at_level(logging.WARNING, logger="taskward.http"):
        assert problem_of(OperationalError("ROLLBACK", None, lost)).status_code == 503
    assert ("store unavailable (OperationalError): requests are answered 503 "
            "store_unavailable; SQLSTATE 57P01 (session ended by an administrator)"
            ) in caplog.text, caplog.text


@pytest.fixture
def locked_sqlite(settings: Settings) -> Iterator[None]:
    """Another process's write transaction holds the SQLite store's write lock."""
    holder = sqlite3.connect(make_url(settings.database_url).database or "",
                             isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_sqlite_store_error_is_answered_as_it_is_and_not_made_again(
    http: TestClient[Any], alice: Caller, model_id: str, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
) -> None:
    task_id = _create(alice, model_id)
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return store_tasks.cancel(*args, **kwargs)

    monkeypatch.setattr(handlers.tasks, "cancel", counted)
    request.getfixturevalue("locked_sqlite")

    answer = alice.post(f"/v1/tasks/{task_id}/cancel")

    assert answer.status_code == 503, answer.text
    assert calls == [1]
    assert not any("dropped" in line for line in _warnings(caplog))
    assert any(line.endswith("; SQLITE_BUSY") for line in _warnings(caplog))
