"""Fair claiming as a running sweeper does it: one sweeper of two slots, read back from
the event log's timestamps (`response.loading` is written by the claim itself)."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import replace

from sqlalchemy import select

from core.settings import Settings
from core.store.births import NewTask, insert_tasks
from core.store.database import Database
from core.tables import task_events, tasks
from scheduler.claiming import execute_due
from tests.scheduler.processes import wait_until
from tests.store.helpers import new_task, task_row


def _bulk(db: Database, model: str, client: str, count: int) -> list[str]:
    request = '{"model": "%s", "input": "words=1"}' % model
    with db.write() as conn:
        rows = insert_tasks(db, conn, [NewTask(client_id=client, model=model,
                                               request_json=request)] * count,
                            db.clock.now_ms())
        db.announce_work(conn)
    return [row.id for row in rows if row is not None]


def _starts(db: Database) -> list[tuple[int, str, str]]:
    """(time of `response.loading`, client, task) of every start, in time order."""
    with db.read() as conn:
        rows = conn.execute(
            select(task_events.c.created_at, tasks.c.client_id, tasks.c.id)
            .join(tasks, tasks.c.id == task_events.c.task_id)
            .where(task_events.c.type == "response.loading"))
        return sorted((row.created_at, row.client_id, row.id) for row in rows)


def _two_slots(fast: Settings) -> Settings:
    return replace(fast, worker_concurrency=2)


def test_a_new_clients_task_starts_within_two_claims_of_a_2000_task_backlog(
    db: Database, fast: Settings, model_id: str
) -> None:
    _bulk(db, model_id, "client-a", 2000)
    stop = threading.Event()
    sweeper = threading.Thread(target=execute_due, args=(db, _two_slots(fast)),
                               kwargs={"stop": stop})
    sweeper.start()
    try:
        wait_until(lambda: len(_starts(db)) >= 10, timeout=30, what="the backlog served")
        lone = new_task(db, model_id, client="client-b", input="words=1")
        # Counted from its commit, not its `created_at`, stamped before the insert: on a
        # loaded machine a claim or two could begin in between and not see it yet.
        committed = db.clock.now_ms()
        wait_until(lambda: task_row(db, lone).status == "completed", timeout=30,
                   what="the lone task done")
    finally:
        stop.set()
        sweeper.join(timeout=30)
    [started] = [at for at, _, task in _starts(db) if task == lone]
    ahead = [task for at, client, task in _starts(db)
             if client == "client-a" and committed < at < started]
    assert len(ahead) <= 4, ahead  # two claims of two slots at most


def test_a_ten_client_mix_is_served_round_robin(
    db: Database, fast: Settings, model_id: str
) -> None:
    clients = [f"client-{n}" for n in range(10)]
    for client in clients:  # each backlog arrives whole before the next client's
        _bulk(db, model_id, client, 10)
    execute_due(db, _two_slots(fast), stop=threading.Event())
    starts = _starts(db)
    assert len(starts) == 100
    nth: dict[str, int] = defaultdict(int)
    for at, client, _ in starts:
        earlier = sum(1 for other, _, _ in starts if other < at)
        # its k-th task starts in round k: no client waits more than one round (plus the
        # other slot's task of the same claim)
        assert earlier < 10 * (nth[client] + 1) + 2, (client, nth[client], earlier)
        nth[client] += 1
