"""`insert_tasks`: many tasks in four statements, each answer matched to its request."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import DataError, OperationalError

from core.clock import Clock
from core.errors import InvalidInput
from core.settings import Settings
from core.store import connect as connect_module
from core.store.births import (
    NewTask,
    insert_rows_alone,
    insert_task,
    insert_tasks,
    task_rows,
)
from core.store.connect import create_db_engine
from core.store.database import WORK_CHANNEL, Database
from core.store.line import places
from core.store.pg_async import AutocommitConnections
from core.tables import responses, task_events, tasks
from tests.scheduler.processes import free_port
from tests.store.helpers import event_types, new_task, task_row


def request(model: str, n: int, **fields: object) -> NewTask:
    return NewTask(client_id=str(fields.pop("client", "client-a")), model=model,
                   request_json=json.dumps({"model": model, "input": f"words={n}"}),
                   metadata={"n": str(n)}, **fields)  # type: ignore[arg-type]


def counts(db: Database) -> tuple[int, int, int]:
    with db.read() as conn:
        return tuple(conn.execute(select(func.count()).select_from(table)).scalar_one()
                     for table in (tasks, responses, task_events))  # type: ignore[return-value]


def test_each_answer_is_its_own_requests_task_and_dedupe_losers_are_none(
    db: Database, model_id: str
) -> None:
    holder = new_task(db, model_id, dedupe_key="held")
    batch = [
        request(model_id, 0),
        request(model_id, 1, dedupe_key="held"),  # an active task holds it
        request(model_id, 2, dedupe_key="k"),
        request(model_id, 3, dedupe_key="k"),  # the first in the batch wins
        request(model_id, 4, dedupe_key="k", client="client-b"),  # another client's key
        request(model_id, 5, run_at=1_000),  # long past: kept as given
    ]
    with db.write() as conn:
        now = db.clock.now_ms()
        answers = insert_tasks(db, conn, batch, now)
    assert [answer is None for answer in answers] == [False, True, False, True, False, False]
    for new, answer in zip(batch, answers, strict=True):
        if answer is None:
            continue
        row = task_row(db, answer.id)
        assert (row.client_id, row.metadata_json, row.dedupe_key) == (
            new.client_id, json.dumps(new.metadata, separators=(",", ":")), new.dedupe_key)
        assert answer.metadata_json == row.metadata_json and answer.run_at == row.run_at
        assert row.run_at == (now if new.run_at is None else new.run_at)
        assert event_types(db, answer.id) == ["response.created"]
    assert counts(db) == (5, 5, 5)  # the holder and four new ones
    assert task_row(db, holder).status == "queued"


def test_batches_larger_than_a_driver_page_still_map_by_id(
    db: Database, model_id: str
) -> None:
    # Every 7th request shares one of 30 dedupe keys, so losers are spread over all pages.
    batch = [request(model_id, n, dedupe_key=f"k{n % 30}" if n % 7 == 0 else None)
             for n in range(2_600)]
    first_holders = {f"k{n % 30}": n for n in reversed(range(0, 2_600, 7))}
    with db.write() as conn:
        answers = insert_tasks(db, conn, batch, db.clock.now_ms())
    with db.read() as conn:
        stored = dict(conn.execute(select(tasks.c.id, tasks.c.metadata_json)).all())
    assert len(answers) == len(batch)
    for n, (new, answer) in enumerate(zip(batch, answers, strict=True)):
        wins = new.dedupe_key is None or first_holders[new.dedupe_key] == n
        assert (answer is not None) == wins
        if answer is not None:
            assert json.loads(stored[answer.id]) == new.metadata
    born = 2_600 - 2_600 // 7 - 1 + 30
    assert counts(db) == (born, born, born)


def test_an_unknown_model_refuses_the_whole_batch_before_writing(
    db: Database, model_id: str
) -> None:
    with pytest.raises(InvalidInput) as refused, db.write() as conn:
        insert_tasks(db, conn, [request(model_id, 1), request("nope", 2)], db.clock.now_ms())
    assert refused.value.code == "model_not_found"
    assert counts(db) == (0, 0, 0)


def test_insert_task_is_a_batch_of_one(db: Database, model_id: str) -> None:
    with db.write() as conn:
        now = db.clock.now_ms()
        first = insert_task(db, conn, request(model_id, 1, dedupe_key="d"), now)
        second = insert_task(db, conn, request(model_id, 2, dedupe_key="d"), now)
        assert insert_tasks(db, conn, [], now) == []
    assert first is not None and second is None
    assert (first.status, first.last_seq, first.output_text) == ("queued", 1, "")
    assert counts(db) == (1, 1, 1)


# SQLite alone: its tasks go in through the driver's own cursor (`core.store.sqlite_births`).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_refused_write_through_the_driver_raises_as_sqlalchemy_does(
    db: Database, model_id: str
) -> None:
    """A store that refuses the write (as a full disk does) raises SQLAlchemy's
    `OperationalError`, which the API answers with 503, without the request in its text."""
    with db.write() as conn:
        conn.exec_driver_sql("PRAGMA query_only=ON")
        try:
            with pytest.raises(OperationalError) as refused:
                insert_tasks(db, conn, [request(model_id, 7)], db.clock.now_ms())
        finally:
            conn.exec_driver_sql("PRAGMA query_only=OFF")
    assert "readonly" in str(refused.value) and "words=7" not in str(refused.value)
    assert counts(db) == (0, 0, 0)


def test_a_batch_takes_the_places_in_line_that_line_places_gives(
    db: Database, model_id: str
) -> None:
    """PostgreSQL finds the places inside its one statement (`core.store.pg_births`);
    they are the ones `core.store.line.places` gives, on either store."""
    for client, priority in [("client-a", 5), ("client-a", 5), ("client-b", 5), ("client-a", 1)]:
        new_task(db, model_id, client=client, priority=priority)
    batch = [request(model_id, n, client=client, priority=priority)
             for n, (client, priority) in enumerate([
                 ("client-a", 5), ("client-c", 5), ("client-a", 5), ("client-b", 1),
                 ("client-a", 1), ("client-c", 5)])]
    batch.insert(3, request(model_id, 9, client="client-a", run_at=2**60))  # not due
    with db.write() as conn:
        expected = places(conn, [(new.client_id, new.priority) for new in batch
                                 if new.run_at is None])
        conn.rollback()
    with db.write() as conn:
        answers = insert_tasks(db, conn, batch, db.clock.now_ms())
    stored = [task_row(db, answer.id).vtime for answer in answers if answer is not None]
    returned = [answer.vtime for answer in answers if answer is not None]
    assert stored == returned == [*expected[:3], None, *expected[3:]]


# PostgreSQL alone: a batch that is only births commits its one statement by itself
# (`core.store.births.insert_rows_alone`, `core.store.driver.autocommit_cursor`), as
# `core.store.new_tasks` runs it: the rows made first, then the statement.
def births_alone(db: Database, news: list[NewTask]) -> list[SimpleNamespace | None]:
    """Each request's task as born alone (its id and line place), None if not inserted."""
    now = db.clock.now_ms()
    rows = task_rows(news, now)
    inserted = insert_rows_alone(db, rows, now)
    return [SimpleNamespace(id=row["id"], vtime=row["vtime"]) if row["id"] in inserted
            else None for row in rows]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_births_alone_write_what_a_transaction_writes_and_are_committed_on_return(
    db: Database, model_id: str
) -> None:
    holder = new_task(db, model_id, dedupe_key="held")
    batch = [request(model_id, 0), request(model_id, 1, dedupe_key="held"),
             request(model_id, 2, dedupe_key="k"), request(model_id, 3, dedupe_key="k"),
             request(model_id, 4, run_at=2**60)]
    with db.write() as conn:  # what the same batch gets in a transaction
        in_transaction = [None if answer is None else answer.vtime
                          for answer in insert_tasks(db, conn, batch, db.clock.now_ms())]
        conn.rollback()
    heard: list[str] = []
    stop = db.listen(WORK_CHANNEL, heard.append)
    try:
        answers = births_alone(db, batch)
    finally:
        stop()
    assert [answer is None for answer in answers] == [False, True, False, True, False]
    assert heard == [""]  # this process's sweeper is woken, as after a commit
    for answer in answers:  # read on other connections: committed
        if answer is not None:
            row = task_row(db, answer.id)
            assert (row.status, row.last_seq, row.vtime) == ("queued", 1, answer.vtime)
            assert event_types(db, answer.id) == ["response.created"]
    assert [None if a is None else a.vtime for a in answers] == in_transaction
    assert counts(db) == (4, 4, 4) and task_row(db, holder).status == "queued"
    with db.engine.connect() as conn:  # the pooled connection went back as it came
        assert conn.connection.driver_connection.autocommit is False  # type: ignore[union-attr]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_births_alone_refuse_as_sqlalchemy_does_and_store_nothing(
    db: Database, model_id: str
) -> None:
    with pytest.raises(InvalidInput) as unknown:
        births_alone(db, [request(model_id, 1), request("no-such-model", 2)])
    assert unknown.value.code == "model_not_found"
    nul = request(model_id, 7, dedupe_key="key\x00")  # PostgreSQL stores no NUL
    with pytest.raises(DataError) as refused:
        births_alone(db, [nul])
    assert "words=7" not in str(refused.value)
    assert counts(db) == (0, 0, 0)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("seen_before_use", [True, False], ids=["ended-idle", "lost-after-check"])
def test_births_alone_on_a_lost_connection(db: Database, model_id: str,
                                           seen_before_use: bool) -> None:
    """The server ended the pool's idle connection. Found so when drawn
    (`core.store.connect`'s checkout look), it is replaced and the births go on; lost
    after that look (a race no look closes: here there is none), it is
    `OperationalError` (the API's 503), and the broken connection leaves the pool
    rather than failing the next request too."""
    if not seen_before_use:
        event.remove(db.engine, "checkout", connect_module._not_closed_while_idle)
    with db.engine.connect(), db.engine.connect():  # the pool holds two connections
        pass
    assert births_alone(db, [request(model_id, 0)])[0] is not None
    with db.engine.connect() as other:  # every other backend of this database ends
        other.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        other.commit()
        # `other` held: the pool's one idle connection is the dead one
        if seen_before_use:
            assert births_alone(db, [request(model_id, 1)])[0] is not None
        else:
            with pytest.raises(OperationalError):
                births_alone(db, [request(model_id, 1)])
        assert births_alone(db, [request(model_id, 2)])[0] is not None
    assert counts(db) == ((3, 3, 3) if seen_before_use else (2, 2, 2))


def test_births_alone_on_a_server_that_refuses_connections_raise_as_sqlalchemy_does(
) -> None:
    """The pool has to connect while the server is down: SQLAlchemy's
    `OperationalError` (the API's 503), not the driver's own (a 500)."""
    down = Database(create_db_engine(Settings(
        database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test")), Clock())
    try:
        with pytest.raises(OperationalError):
            births_alone(down, [request("words", 0)])
    finally:
        down.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_event_loops_connections_raise_as_sqlalchemy_does_and_are_kept(
    db: Database,
) -> None:
    """`core.store.pg_async`: a refused statement is SQLAlchemy's error, without its
    parameters; the connection, still sound, serves the next statement."""
    connections = AutocommitConnections(db)

    async def scenario() -> list[int]:
        pids = []
        for _ in range(2):
            with pytest.raises(DataError) as refused:
                await connections.first_row("SELECT %(secret)s::int / 0", {"secret": 7})
            assert "secret" not in str(refused.value.params or "")
            pids.append((await connections.first_row("SELECT pg_backend_pid()", {}))[0])
        await connections.close()
        return pids

    first, second = asyncio.run(scenario())
    assert first == second
