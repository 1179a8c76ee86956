"""Group commit: requests that wait together commit together, each answered as alone."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Connection, select, text
from sqlalchemy.exc import OperationalError

from core.errors import InvalidInput
from core.idempotency import IdempotencyClaim
from core.store import new_tasks, pg_async
from core.store.births import NewTask
from core.store.database import Database
from core.store.libpq import libpq_conninfo
from core.store.new_tasks import Enqueued
from core.tables import task_events, tasks
from handlers import arrivals as arrivals_module
from handlers import enqueuing
from handlers.arrivals import Arrivals
from handlers.enqueuing import Enqueuer
from tests.scheduler.processes import wait_until


def new(model: str, **fields: Any) -> NewTask:
    return NewTask(client_id="c", model=model, request_json=json.dumps({"input": "words=1"}),
                   **fields)


def run_together(db: Database, requests: list[tuple[NewTask, IdempotencyClaim | None]]
                 ) -> list[Enqueued | BaseException]:
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)

    async def all_at_once() -> list[Enqueued | BaseException]:
        return await asyncio.gather(*(enqueuer.enqueue(task, claim) for task, claim in requests),
                                    return_exceptions=True)

    return asyncio.run(all_at_once())


def counted_writes(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each write transaction `db` opens from now on."""
    commits: list[int] = []
    original = db.write

    def counted() -> Any:
        commits.append(1)
        return original()

    monkeypatch.setattr(db, "write", counted)
    return commits


def test_a_burst_commits_in_few_transactions(db: Database, model_id: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    commits = counted_writes(db, monkeypatch)
    answers = run_together(db, [(new(model_id), None) for _ in range(40)])
    assert all(isinstance(a, Enqueued) and a.status_code == 202 for a in answers)
    assert len({a.task_id for a in answers if isinstance(a, Enqueued)}) == 40
    assert len(commits) < 10


def test_conflicts_in_a_batch_are_answered_as_enqueue_would(db: Database, model_id: str) -> None:
    key = IdempotencyClaim("same-key", "digest-a")
    answers = run_together(db, [
        (new(model_id), key),
        (new(model_id), key),
        (new(model_id), IdempotencyClaim("same-key", "digest-b")),
        (new(model_id, dedupe_key="daily"), None),
        (new(model_id, dedupe_key="daily"), None),
        (new("no-such-model"), None),
        (new(model_id), None),
    ])
    first, replay, reused, deduped, dedupe_hit, unknown, plain = answers
    assert isinstance(first, Enqueued) and isinstance(replay, Enqueued)
    assert replay.replayed and (replay.task_id, replay.body) == (first.task_id, first.body)
    assert isinstance(reused, InvalidInput) and reused.code == "idempotency_key_reused"
    assert isinstance(deduped, Enqueued) and isinstance(dedupe_hit, Enqueued)
    assert dedupe_hit.dedupe_hit and dedupe_hit.task_id == deduped.task_id
    assert isinstance(unknown, InvalidInput) and unknown.code == "model_not_found"
    assert isinstance(plain, Enqueued) and plain.status_code == 202
    with db.read() as conn:  # the rolled-back halves of conflicting requests left nothing
        stored = set(conn.execute(select(tasks.c.id)).scalars())
        orphans = conn.execute(select(task_events.c.task_id)
                               .where(task_events.c.task_id.not_in(stored))).all()
    assert stored == {first.task_id, deduped.task_id, plain.task_id} and orphans == []


def test_clients_may_share_a_key_in_one_batch(db: Database, model_id: str) -> None:
    answers = run_together(db, [
        (NewTask(client_id=client, model=model_id, request_json="{}"),
         IdempotencyClaim("shared", "digest")) for client in ("a", "b", "a")])
    a_first, b_first, a_again = answers
    assert isinstance(a_again, Enqueued) and a_again.replayed
    assert a_again.task_id == a_first.task_id != b_first.task_id  # type: ignore[union-attr]


def _stored(db: Database, task_id: str) -> bool:
    with db.read() as conn:
        return conn.execute(select(tasks.c.id).where(tasks.c.id == task_id)).first() is not None


def test_no_answer_comes_before_its_commit(db: Database, model_id: str) -> None:
    """Whatever batches carry them, each request hears its task only once another
    connection can read it."""
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
    seen_stored: list[bool] = []

    async def one(i: int) -> None:
        await asyncio.sleep(0.001 * (i % 7))  # arrivals spread over several commits
        answer = await enqueuer.enqueue(new(model_id), None)
        seen_stored.append(_stored(db, answer.task_id))

    async def burst() -> None:
        await asyncio.gather(*(one(i) for i in range(60)))

    asyncio.run(burst())
    assert seen_stored == [True] * 60


# PostgreSQL only: SQLite admits one writer at a time, so one batch is in flight by design.
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_postgresql_answers_a_request_while_an_earlier_batch_still_waits(
    db: Database, model_id: str
) -> None:
    """Several batches are in flight on PostgreSQL: a request that arrives while an
    earlier batch waits (here, on a key another transaction holds) is answered first."""
    import psycopg

    dsn = libpq_conninfo(db.engine)
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
    order: list[str] = []

    async def scenario(holder: psycopg.Connection[Any]) -> None:
        waiting = asyncio.ensure_future(enqueuer.enqueue(new(model_id),
                                                         IdempotencyClaim("held", "d")))
        waiting.add_done_callback(lambda _f: order.append("waiting"))
        await asyncio.sleep(0.5)  # its batch now waits for the holder's key
        await asyncio.wait_for(enqueuer.enqueue(new(model_id), None), timeout=10)
        order.append("later")
        holder.rollback()  # the key is free: the first batch goes on
        await waiting

    with psycopg.connect(dsn) as holder:
        holder.execute("INSERT INTO idempotency_keys VALUES ('c', 'held', 'd', 202, '', "
                       "'resp_x', 0, 9999999999999)")
        asyncio.run(scenario(holder))
    assert order == ["later", "waiting"]


# SQLite alone: PostgreSQL has no turn to wait for (`Database.write_turn` is free there).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_requests_that_arrive_while_the_batch_waits_for_its_turn_join_it(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is taken once the turn to write has come, not when it was asked for: what
    arrived while another writer held the store commits in the same transaction."""
    commits = counted_writes(db, monkeypatch)
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
    held, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with db.write_turn():
            held.set()
            release.wait(timeout=10)

    async def scenario() -> list[Enqueued]:
        first = asyncio.ensure_future(enqueuer.enqueue(new(model_id), None))
        await asyncio.sleep(0.2)  # its drainer now waits for the turn
        later = [asyncio.ensure_future(enqueuer.enqueue(new(model_id), None))
                 for _ in range(9)]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *later)

    holder = threading.Thread(target=other_writer)
    holder.start()
    held.wait(timeout=10)
    answers = asyncio.run(scenario())
    holder.join()
    assert len({answer.task_id for answer in answers}) == 10
    assert len(commits) == 1


def test_a_turn_that_fails_answers_every_waiting_request_with_its_error(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable() -> Any:
        raise OperationalError("BEGIN", {}, Exception("the store is gone"))

    monkeypatch.setattr(db, "write_turn", unavailable)
    # With an idempotency key and a dedupe key, a request is a transaction on either
    # store, so it waits for a turn.
    answers = run_together(db, [(new(model_id, dedupe_key=f"d{n}"), IdempotencyClaim(f"k{n}", "d"))
                                for n in range(5)])
    assert all(isinstance(answer, OperationalError) for answer in answers)


# PostgreSQL alone: a batch without keys or quotas is one statement committing by itself,
# run on the event loop (`core.store.pg_async`), not in a transaction on the writer thread.
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_batch_of_births_alone_commits_on_the_loop_and_leaves_conflicts_to_enqueue(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = counted_writes(db, monkeypatch)
    answers = run_together(db, [(new(model_id), None) for _ in range(20)])
    assert len({a.task_id for a in answers if isinstance(a, Enqueued)}) == 20
    assert commits == []  # no transaction: each batch's statement committed by itself
    first, deduped, dedupe_hit, unknown, plain = run_together(db, [
        (new(model_id), None), (new(model_id, dedupe_key="daily"), None),
        (new(model_id, dedupe_key="daily"), None), (new("no-such-model"), None),
        (new(model_id), None)])
    assert isinstance(deduped, Enqueued) and isinstance(dedupe_hit, Enqueued)
    assert dedupe_hit.dedupe_hit and dedupe_hit.task_id == deduped.task_id
    assert isinstance(unknown, InvalidInput) and unknown.code == "model_not_found"
    assert all(isinstance(a, Enqueued) and a.status_code == 202 for a in (first, plain))


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_births_with_idempotency_keys_commit_on_the_loop_and_their_repeats_replay(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = counted_writes(db, monkeypatch)
    keyed: list[tuple[NewTask, IdempotencyClaim | None]] = [
        (new(model_id), IdempotencyClaim(f"k{n}", "d")) for n in range(5)]
    first = [a for a in run_together(db, keyed) if isinstance(a, Enqueued) and not a.replayed]
    assert len(first) == 5 and commits == []  # the records rode in the births' statement
    *again, reused = run_together(db, [*keyed, (new(model_id), IdempotencyClaim("k0", "x"))])
    assert [(a.task_id, a.body, a.replayed) for a in again if isinstance(a, Enqueued)] == [
        (a.task_id, a.body, True) for a in first]
    assert isinstance(reused, InvalidInput) and reused.code == "idempotency_key_reused"
    with db.read() as conn:  # the repeats' tasks were never inserted
        assert set(conn.execute(select(tasks.c.id)).scalars()) == {a.task_id for a in first}
    del commits[:]
    [both] = run_together(db, [(new(model_id, dedupe_key="x"), IdempotencyClaim("k9", "d"))])
    assert isinstance(both, Enqueued) and len(commits) == 1  # a dedupe key too: a transaction


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_one_batch_is_in_flight_unless_it_stalls(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests arriving while a batch commits wait for it and share the next one; a
    batch that stays out past `STALLED_SECONDS` lets another start beside it."""
    out, most, sizes = [0], [0], []
    stall = [0.0]

    async def counted(db: Database, connections: Any, batch: Any, **options: Any) -> Any:
        out[0] += 1
        most[0] = max(most[0], out[0])
        sizes.append(len(batch))
        try:
            if len(sizes) == 1:
                await asyncio.sleep(stall[0])
            return await new_tasks.enqueue_many_async(db, connections, batch, **options)
        finally:
            out[0] -= 1

    monkeypatch.setattr(enqueuing, "enqueue_many_async", counted)

    async def burst() -> None:
        enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
        await enqueuer.enqueue(new(model_id), None)  # the loop's connection is open
        most[0], sizes[:] = 0, []
        first = asyncio.ensure_future(enqueuer.enqueue(new(model_id), None))
        await asyncio.sleep(0)  # its batch is out
        await asyncio.gather(first, *(enqueuer.enqueue(new(model_id), None)
                                      for _ in range(30)))
        await enqueuer.close()

    monkeypatch.setattr(enqueuing, "STALLED_SECONDS", 30.0)  # nothing stalls
    asyncio.run(burst())
    assert most == [1] and sizes == [1, 30]
    monkeypatch.setattr(enqueuing, "STALLED_SECONDS", 0.05)
    stall[0] = 0.5  # the first batch of the burst stays out
    looks: list[Enqueuer] = []
    look_again = Enqueuer._look_again

    def looked(self: Enqueuer) -> None:
        looks.append(self)
        look_again(self)

    monkeypatch.setattr(Enqueuer, "_look_again", looked)
    asyncio.run(burst())
    assert most == [2] and sizes == [1, 30]  # the 30 went out while the first stalled
    assert len(looks) == 1  # one timer for the burst, not one per request


def _other_backends(conn: Connection) -> int:
    """Backends of this database but `conn`'s, counted afresh: a transaction keeps the
    statistics it first read, so each count ends its own."""
    count = int(conn.execute(text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()")).scalar_one())
    conn.commit()
    return count


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("seen_before_use", [True, False], ids=["ended-idle", "lost-after-check"])
def test_a_lost_loop_connection_fails_no_request_and_is_replaced(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch, seen_before_use: bool
) -> None:
    """The server ended the loop's connection while it was kept. Found so before use
    (`closed_while_idle`), it is replaced and the batch goes on the loop; lost after
    that look (a race no look closes: here the look is blinded), that batch's births are
    read back and made again with their own ids on the writer thread, not made afresh by
    `enqueue`, and the next batch opens a fresh connection. No request fails either way."""
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
    alone: list[NewTask] = []

    def enqueue_alone(db: Database, task: NewTask, **options: Any) -> Enqueued:
        alone.append(task)
        return new_tasks.enqueue(db, task, **options)

    monkeypatch.setattr(enqueuing, "enqueue", enqueue_alone)
    if not seen_before_use:
        monkeypatch.setattr(pg_async, "closed_while_idle", lambda connection: False)

    async def scenario() -> list[Enqueued]:
        await enqueuer.enqueue(new(model_id), None)  # opens the loop's connection
        with db.engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid()"))
            other.commit()
            # Ended means gone: the call only signals the backends, and on a busy
            # machine the look came before their connections had closed.
            wait_until(lambda: _other_backends(other) == 0, timeout=10,
                       what="the terminated backends to exit")
        answers = [await enqueuer.enqueue(new(model_id), None) for _ in range(3)]
        await enqueuer.close()
        return answers

    answers = asyncio.run(scenario())
    assert all(answer.status_code == 202 for answer in answers)
    assert all(_stored(db, answer.task_id) for answer in answers)
    # the batch that met the dead connection is read back, never made afresh by `enqueue`
    assert alone == []


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_refused_batch_keeps_the_loops_connection(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown model refuses the loop's batch (then `enqueue` answers
    `model_not_found`); the connection, sound, serves the next batch."""
    import psycopg

    opened: list[int] = []
    connect = psycopg.AsyncConnection.connect

    async def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return await connect(*args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", counted)
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)

    async def scenario() -> None:
        await enqueuer.enqueue(new(model_id), None)
        with pytest.raises(InvalidInput):
            await enqueuer.enqueue(new("no-such-model"), None)
        await enqueuer.enqueue(new(model_id), None)
        await enqueuer.close()

    asyncio.run(scenario())
    assert opened == [1]


def _batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch an `Enqueuer` takes from now on."""
    sizes: list[int] = []
    take = Enqueuer._take

    def counted(self: Enqueuer) -> list[Any]:
        batch = take(self)
        sizes.append(len(batch))
        return batch

    monkeypatch.setattr(Enqueuer, "_take", counted)
    return sizes


def test_a_batch_waits_for_the_bodies_being_read_and_carries_them(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose body was being read when the batch was due joins it; each
    request is still answered only once its task is stored."""
    monkeypatch.setattr(arrivals_module, "MAX_WAIT_SECONDS", 30.0)  # only the body ends it
    sizes = _batch_sizes(monkeypatch)
    arrivals = Arrivals()
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000, arrivals=arrivals)
    stored_when_answered: list[bool] = []

    async def answered() -> None:
        answer = await enqueuer.enqueue(new(model_id), None)
        stored_when_answered.append(_stored(db, answer.task_id))

    async def scenario() -> None:
        arrivals.started("second")  # its body is on its way
        first = asyncio.ensure_future(answered())
        await asyncio.sleep(0.2)
        assert not first.done() and sizes == []  # the batch waits for that body
        second = asyncio.ensure_future(answered())
        await asyncio.sleep(0)  # the second request is pending
        arrivals.finished("second")
        await asyncio.gather(first, second)
        await enqueuer.close()

    asyncio.run(scenario())
    assert sizes == [2] and stored_when_answered == [True, True]


def test_a_body_that_does_not_come_holds_a_batch_for_the_bound_only(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals_module, "MAX_WAIT_SECONDS", 0.3)
    arrivals = Arrivals()
    arrivals.started("stalled")
    took, answer = asyncio.run(_timed_enqueue(
        Enqueuer(db, idempotency_ttl_ms=60_000, arrivals=arrivals), new(model_id)))
    assert 0.3 <= took < 5 and _stored(db, answer.task_id)


def test_with_no_body_on_its_way_a_batch_waits_for_nothing(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals_module, "MAX_WAIT_SECONDS", 30.0)
    arrivals = Arrivals()
    arrivals.started("read")
    arrivals.finished("read")
    took, _ = asyncio.run(_timed_enqueue(
        Enqueuer(db, idempotency_ttl_ms=60_000, arrivals=arrivals), new(model_id)))
    assert took < 5


async def _timed_enqueue(enqueuer: Enqueuer, task: NewTask) -> tuple[float, Enqueued]:
    """One enqueue through `enqueuer` (closed afterwards) and how long its answer took."""
    started = time.monotonic()
    answer = await enqueuer.enqueue(task, None)
    took = time.monotonic() - started
    await enqueuer.close()
    return took, answer
