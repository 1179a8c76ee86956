"""Claim order: priorities first, then round-robin across clients, oldest first within one.

Store level, both stores: each claim here takes one task, so the order of claims is the
order of the line. The sweeper-level checks (one sweeper, two slots, event timestamps)
are in tests/scheduler/test_fairness.py.
"""

from __future__ import annotations

from collections import Counter

from freezegun import freeze_time
from sqlalchemy import select

from core.store import claims, worker_writes
from core.store.births import NewTask, insert_tasks
from core.store.database import Database
from core.tables import tasks
from tests.store.helpers import new_task, task_row

LEASE = 60_000


def _next(db: Database, limit: int = 1) -> list[str]:
    return [c.task_id for c in claims.claim(db, limit=limit, lease_ms=LEASE, node_id="n")]


def _bulk(db: Database, model: str, client: str, count: int, priority: int = 5,
          run_at: int | None = None) -> list[str]:
    """`count` tasks of one client in one transaction, as a group commit makes them."""
    with db.write() as conn:
        rows = insert_tasks(db, conn, [NewTask(client_id=client, model=model, request_json="{}",
                                               priority=priority, run_at=run_at)] * count,
                            db.clock.now_ms())
    return [row.id for row in rows if row is not None]


def _owner(db: Database, task_id: str) -> str:
    return str(task_row(db, task_id).client_id)


def test_a_priority_0_task_is_claimed_before_50_priority_9_ones(
    db: Database, model_id: str
) -> None:
    _bulk(db, model_id, "client-a", 50, priority=9)
    urgent = new_task(db, model_id, client="client-a", priority=0)
    assert _next(db) == [urgent]


def test_equal_priority_keeps_oldest_first_within_a_client(db: Database, model_id: str) -> None:
    ids = [new_task(db, model_id, priority=3) for _ in range(5)]
    assert [task for _ in ids for task in _next(db)] == ids


def test_a_new_client_is_claimed_within_two_claims_of_another_clients_backlog(
    db: Database, model_id: str
) -> None:
    _bulk(db, model_id, "client-a", 2000)
    _next(db, limit=3)  # the backlog is being served when B arrives
    lone = new_task(db, model_id, client="client-b")
    assert lone in _next(db) + _next(db)


def test_ten_clients_are_served_round_robin(db: Database, model_id: str) -> None:
    clients = [f"client-{n}" for n in range(10)]
    for client in clients:  # each client's whole backlog arrives before the next one's
        _bulk(db, model_id, client, 5)
    order = [_owner(db, task) for _ in range(50) for task in _next(db)]
    rounds = [order[start:start + 10] for start in range(0, 50, 10)]
    assert all(sorted(served) == clients for served in rounds), rounds


def test_a_client_that_joins_late_takes_turns_with_the_backlogged_one(
    db: Database, model_id: str
) -> None:
    _bulk(db, model_id, "client-a", 100)
    _next(db, limit=10)
    _bulk(db, model_id, "client-b", 10)
    order = [_owner(db, task) for _ in range(20) for task in _next(db)]
    assert Counter(order) == {"client-a": 10, "client-b": 10}
    assert all(a != b for a, b in zip(order, order[1:])), order  # they alternate


def test_a_claim_takes_a_higher_priority_before_any_client_turn(
    db: Database, model_id: str
) -> None:
    _bulk(db, model_id, "client-a", 10, priority=5)
    low = _bulk(db, model_id, "client-b", 3, priority=7)
    high = _bulk(db, model_id, "client-c", 3, priority=2)
    taken = _next(db, limit=16)
    assert taken[:3] == high and taken[-3:] == low


def test_a_delayed_task_waits_outside_the_line_and_joins_when_due(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-12-01 08:00:00") as frozen:
        later = new_task(db, model_id, client="client-b", run_at=db.clock.now_ms() + 60_000)
        assert task_row(db, later).vtime is None
        backlog = _bulk(db, model_id, "client-a", 20)
        assert _next(db, limit=2) == backlog[:2]
        frozen.tick(61)
        assert later in _next(db) + _next(db)


def test_a_retried_task_leaves_the_line_until_its_backoff_is_over(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-12-01 08:00:00") as frozen:
        first, second = _bulk(db, model_id, "client-a", 2)
        [claimed] = claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")
        worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=5_000,
                              code="engine_error", message="retry me")
        assert task_row(db, first).vtime is None
        assert _next(db, limit=2) == [second]
        frozen.tick(6)
        assert _next(db) == [first]


def test_a_delayed_task_is_claimed_in_the_first_round_after_1000_earlier_delayed_ones(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-12-01 08:00:00") as frozen:
        due = db.clock.now_ms() + 60_000
        _bulk(db, model_id, "client-a", 1000, run_at=due)
        lone = new_task(db, model_id, client="client-b", run_at=due + 1)
        frozen.tick(61)
        assert lone in _next(db, limit=2)  # one claim of two is one round of two clients


def test_a_task_back_from_its_backoff_is_claimed_in_the_first_round_after_1000_waiting_ones(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-12-01 08:00:00") as frozen:
        retried = new_task(db, model_id, client="client-b")
        [claimed] = claims.claim(db, limit=1, lease_ms=LEASE, node_id="n")
        _bulk(db, model_id, "client-a", 1000, run_at=db.clock.now_ms() + 1_000)
        worker_writes.requeue(db, claimed.task_id, claimed.owner_token, delay_ms=2_000,
                              code="engine_error", message="retry me")
        frozen.tick(3)
        assert retried in _next(db, limit=2)


def test_one_clients_delayed_backlog_alone_drains_whole_in_run_at_order(
    db: Database, model_id: str
) -> None:
    with freeze_time("2026-12-01 08:00:00") as frozen:
        now = db.clock.now_ms()
        with db.write() as conn:  # 300 due times, shuffled, some shared
            insert_tasks(db, conn, [NewTask(client_id="client-a", model=model_id,
                                            request_json="{}",
                                            run_at=now + 1_000 + (k * 7_919) % 250)
                                    for k in range(300)], now)
            expected = [row.id for row in conn.execute(
                select(tasks.c.id).order_by(tasks.c.run_at, tasks.c.id))]
        frozen.tick(2)
        taken: list[str] = []
        while batch := _next(db, limit=16):
            taken += batch
    assert taken == expected
