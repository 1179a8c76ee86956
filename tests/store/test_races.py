"""Real multi-process races on both stores: claims, cancel against finish, idempotency.

Each racer is a separate OS process with its own engine and connection pool, as
several sweepers or API workers would be; a race too narrow to meet by chance is forced
by holding one side's transaction open.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import delete, func, select

from core.engines.base import Usage
from core.errors import CancelRequested, Conflict, NotFound, TooManyRequests
from core.idempotency import IdempotencyClaim
from core.settings import Settings
from core.store import births, claims, completion, new_tasks, tasks, worker_writes
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from core.tables import idempotency_keys, responses, task_events
from core.tables import tasks as tasks_table
from handlers.enqueuing import Enqueuer
from tests.store.helpers import assert_log_sound

SPAWN = multiprocessing.get_context("spawn")
LEASE = 60_000


def _open(url: str) -> Database:
    return Database(create_db_engine(Settings(database_url=url)))


def _claim_and_finish(url: str, start: Any, results: Any) -> None:
    db = _open(url)
    start.wait()
    taken: list[tuple[str, int]] = []
    idle = 0
    while idle < 3:
        batch = claims.claim(db, limit=10, lease_ms=LEASE, node_id="racer")
        idle = idle + 1 if not batch else 0
        for claimed in batch:
            worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
            completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage())
            taken.append((claimed.task_id, claimed.attempt))
    results.put(taken)
    db.dispose()


def _enqueue_many(db: Database, model: str, count: int) -> list[str]:
    return [new_tasks.enqueue(db, births.NewTask(client_id="c", model=model,
                                                    request_json="{}")).task_id
            for _ in range(count)]


def _run(jobs: list[tuple[Any, tuple[Any, ...]]]) -> list[Any]:
    """Start every (target, args) in its own process, release them at once, collect."""
    start = SPAWN.Event()
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=target, args=(*args, start, results))
                 for target, args in jobs]
    for process in processes:
        process.start()
    start.set()
    collected = [results.get(timeout=180) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return collected


def test_four_processes_claim_every_attempt_exactly_once(
    db: Database, database_url: str, model_id: str
) -> None:
    ids = _enqueue_many(db, model_id, 2000)
    taken = [pair for batch in _run([(_claim_and_finish, (database_url,))] * 4) for pair in batch]
    assert sorted(task_id for task_id, _ in taken) == sorted(ids)
    assert Counter(taken).most_common(1)[0][1] == 1
    assert len({attempt for _, attempt in taken}) == 1
    with db.read() as conn:
        loading = conn.execute(
            select(task_events.c.task_id, func.count())
            .where(task_events.c.type == "response.loading")
            .group_by(task_events.c.task_id)).all()
        statuses = conn.execute(select(tasks_table.c.status, func.count())
                                .group_by(tasks_table.c.status)).all()
    assert len(loading) == 2000 and {n for _, n in loading} == {1}
    assert dict(statuses) == {"completed": 2000}


def _cancel_all(url: str, ids: list[str], start: Any, results: Any) -> None:
    db = _open(url)
    start.wait()
    outcomes = []
    for task_id in ids:
        try:
            outcomes.append(tasks.cancel(db, task_id, None).status_code)
        except Conflict:
            outcomes.append(409)
    results.put(("cancel", outcomes))
    db.dispose()


def _finish_all(url: str, held: list[tuple[str, str]], start: Any, results: Any) -> None:
    db = _open(url)
    start.wait()
    outcomes = []
    for task_id, owner in held:
        try:
            completion.complete(db, task_id, owner, [], usage=Usage())
            outcomes.append("completed")
        except CancelRequested:
            worker_writes.finish_cancelled(db, task_id, owner)
            outcomes.append("cancelled")
    results.put(("finish", outcomes))
    db.dispose()


def test_cancel_racing_finish_never_yields_both(
    db: Database, database_url: str, model_id: str
) -> None:
    _enqueue_many(db, model_id, 1000)
    held = []
    while batch := claims.claim(db, limit=100, lease_ms=LEASE, node_id="n"):
        for claimed in batch:
            worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
            held.append((claimed.task_id, claimed.owner_token))
    ids = [task_id for task_id, _ in held]
    outcomes = dict(_run([(_cancel_all, (database_url, ids)),
                          (_finish_all, (database_url, held))]))
    with db.read() as conn:
        final = dict(conn.execute(select(tasks_table.c.id, tasks_table.c.status)).all())
    for task_id, cancel_code, finished in zip(ids, outcomes["cancel"], outcomes["finish"]):
        assert final[task_id] == finished
        assert (cancel_code == 409) == (finished == "completed")
    assert set(final.values()) <= {"completed", "cancelled"}
    for task_id in ids[::50]:
        assert_log_sound(db, task_id)


def test_a_delete_that_loses_to_another_answers_not_found(
    db: Database, model_id: str
) -> None:
    """Another call's delete is under way (its transaction open) as this one starts: on
    PostgreSQL this one reads the task, waits on the other's row locks, then deletes
    nothing; it must say so (404), not answer as though it had deleted it."""
    [task_id] = _enqueue_many(db, model_id, 1)
    [claimed] = claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")
    worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
    completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage())
    answers: list[str] = []

    def second() -> None:
        try:
            tasks.delete_finished(db, task_id, None)
            answers.append("deleted")
        except NotFound:
            answers.append("not found")

    with db.write() as first:  # the first delete, its locks held until the block ends
        first.execute(delete(task_events).where(task_events.c.task_id == task_id))
        first.execute(delete(responses).where(responses.c.task_id == task_id))
        first.execute(delete(tasks_table).where(tasks_table.c.id == task_id))
        racer = threading.Thread(target=second)
        racer.start()
        time.sleep(0.5)  # it has read the task and waits on our locks (PostgreSQL)
    racer.join(30)
    assert answers == ["not found"]


def _enqueue_with_key(url: str, model: str, start: Any, results: Any) -> None:
    db = _open(url)
    start.wait()
    new = births.NewTask(client_id="c", model=model, request_json="{}")
    outcome = new_tasks.enqueue(db, new, idempotency=IdempotencyClaim("same-key", "same-digest"))
    results.put((outcome.task_id, outcome.body.decode()))
    db.dispose()


def test_concurrent_enqueues_with_one_idempotency_key_create_one_task(
    db: Database, database_url: str, model_id: str
) -> None:
    outcomes = _run([(_enqueue_with_key, (database_url, model_id))] * 8)
    assert len({task_id for task_id, _ in outcomes}) == 1
    assert len({body for _, body in outcomes}) == 1
    assert json.loads(outcomes[0][1])["status"] == "queued"
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(tasks_table)).scalar() == 1


def _enqueue_with_key_through_a_group_commit(url: str, model: str, start: Any,
                                             results: Any) -> None:
    db = _open(url)
    enqueuer = Enqueuer(db, idempotency_ttl_ms=60_000)
    new = births.NewTask(client_id="c", model=model, request_json="{}")

    async def once() -> new_tasks.Enqueued:
        try:
            return await enqueuer.enqueue(new, IdempotencyClaim("same-key", "same-digest"))
        finally:
            await enqueuer.close()

    start.wait()
    outcome = asyncio.run(once())
    results.put((outcome.task_id, outcome.body.decode(), outcome.replayed))
    db.dispose()


def test_api_processes_racing_one_idempotency_key_create_one_task(
    db: Database, database_url: str, model_id: str
) -> None:
    """As above through each process's group commit (`handlers.enqueuing`): on
    PostgreSQL the births and the record are one statement on the event loop, the
    record stored first and the task only if it was; the losers wait for the winner's
    commit and replay its answer."""
    outcomes = _run([(_enqueue_with_key_through_a_group_commit, (database_url, model_id))] * 8)
    assert len({task_id for task_id, _, _ in outcomes}) == 1
    assert len({body for _, body, _ in outcomes}) == 1
    assert sorted(replayed for _, _, replayed in outcomes) == [False] + [True] * 7
    with db.read() as conn:
        for table in (tasks_table, task_events, idempotency_keys):
            assert conn.execute(select(func.count()).select_from(table)).scalar() == 1


def test_four_processes_claim_every_attempt_once_across_priorities_and_many_clients(
    db: Database, database_url: str, model_id: str
) -> None:
    news = [births.NewTask(client_id=f"client-{n % 50}", model=model_id,
                              request_json="{}", priority=n % 10) for n in range(1000)]
    with db.write() as conn:
        ids = [row.id for row in births.insert_tasks(db, conn, news, db.clock.now_ms())
               if row is not None]
    taken = [pair for batch in _run([(_claim_and_finish, (database_url,))] * 4) for pair in batch]
    assert sorted(task_id for task_id, _ in taken) == sorted(ids)
    assert Counter(taken).most_common(1)[0][1] == 1
    with db.read() as conn:
        statuses = conn.execute(select(tasks_table.c.status, func.count())
                                .group_by(tasks_table.c.status)).all()
    assert dict(statuses) == {"completed": 1000}
    for task_id in ids[::100]:
        assert_log_sound(db, task_id)


QUOTA = 25


def _enqueue_at_the_edge(url: str, client_id: str, model: str, grouped: bool, start: Any,
                         results: Any) -> None:
    """40 requests at a client limited to QUOTA: one by one, or in group commits of 8."""
    db = _open(url)
    start.wait()
    new = births.NewTask(client_id=client_id, model=model, request_json="{}",
                            max_active=QUOTA)
    created = 0
    for _ in range(5 if grouped else 40):
        if grouped:
            created += sum(1 for answer in new_tasks.enqueue_many(db, [(new, None)] * 8)
                           if answer is not None)
            continue
        try:
            new_tasks.enqueue(db, new)
            created += 1
        except TooManyRequests:
            pass
    results.put(created)
    db.dispose()


def test_concurrent_enqueues_at_the_edge_of_max_active_tasks_never_overshoot(
    db: Database, database_url: str, model_id: str
) -> None:
    client_id = create_client(db, name="edge", scopes=frozenset({"responses:create"})).client_id
    jobs = [(_enqueue_at_the_edge, (database_url, client_id, model_id, grouped))
            for grouped in (False, False, True, True)]
    created = _run(jobs)
    with db.read() as conn:
        stored = conn.execute(select(func.count()).select_from(tasks_table)
                              .where(tasks_table.c.client_id == client_id)).scalar()
    assert sum(created) == stored == QUOTA
