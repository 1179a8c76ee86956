"""Soak: two sweeper processes killed -9 and restarted again and again under load.

`make test` proves each crash path once; this run (`make test-slow`, about two minutes)
piles them up: claims, heartbeats, flushes, finishes, lease expiry, the cold-start hook
of a restarted node and the resume of a half-streamed task all meet the same tasks. At
the end every task must be completed with exactly its text (nothing repeated, nothing
lost), each attempt claimed once, and every event log sound.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import pytest
from sqlalchemy import func, select

from core.settings import Settings
from core.states import TERMINAL, OnRestart, Status
from core.store.births import NewTask, insert_tasks
from core.store.database import Database
from core.tables import responses, task_events, tasks
from tests.engines import expected_text
from tests.scheduler.processes import Children, environment, run_command, wait_until
from tests.store.helpers import assert_log_sound

pytestmark = pytest.mark.slow

TASKS = 800
KILLS = 12
NODES = ("node-1", "node-2")
CLAIM_EVENTS = ("response.loading", "response.in_progress")


def words_of(index: int) -> int:
    return 10 + index % 21  # 10..30 words, 10-20 ms each


def enqueue_mixed(db: Database, model: str) -> dict[str, int]:
    """`TASKS` tasks, half `retry` and half `resume`, in one transaction; id -> words."""
    news = [NewTask(client_id="client-a", model=model, max_attempts=10,
                    on_restart=(OnRestart.RETRY, OnRestart.RESUME)[n % 2],
                    request_json=json.dumps({"model": model, "input":
                                             f"words={words_of(n)} delay=0.015"}))
            for n in range(TASKS)]
    with db.write() as conn:
        rows = insert_tasks(db, conn, news, db.clock.now_ms())
        db.announce_work(conn)
    return {row.id: words_of(n) for n, row in enumerate(rows) if row is not None}


def unfinished(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).where(
            tasks.c.status.not_in([s.value for s in TERMINAL]))).scalar_one())


def test_sweepers_killed_and_restarted_under_load_lose_and_repeat_nothing(
    db: Database, settings: Settings, model_id: str, children: Children
) -> None:
    envs = {node: environment(replace(settings, node_id=node),
                              lease_seconds=2, heartbeat_seconds=0.5, flush_interval_ms=50,
                              worker_concurrency=4) for node in NODES}
    running = {node: children.start(envs[node], "sweeper") for node in NODES}
    words = enqueue_mixed(db, model_id)
    chaos = random.Random(20261201)

    for _ in range(KILLS):
        time.sleep(chaos.uniform(0.5, 2.0))
        node = chaos.choice(NODES)
        children.kill9(running[node])
        # The restarted node's cold-start hook. One SQLite store is one machine: the
        # hook recovers every task there, so it refuses while the other node's
        # sweeper lives, and lease expiry takes the killed node's tasks instead.
        hook = run_command(envs[node], "recover", "--json")
        assert hook.returncode == (1 if db.is_sqlite else 0), hook.stderr
        running[node] = children.start(envs[node], "sweeper")
    wait_until(lambda: unfinished(db) == 0, timeout=240, what="every task finished")

    with db.read() as conn:
        rows = {row.id: row for row in conn.execute(select(tasks))}
        texts = {row.task_id: row.output_text for row in conn.execute(select(responses))}
        claims: dict[str, list[int]] = {}
        resumes = 0
        for event in conn.execute(
                select(task_events).where(task_events.c.type.in_(CLAIM_EVENTS))
                .order_by(task_events.c.task_id, task_events.c.seq)):
            if "attempt" in (payload := json.loads(event.data)):
                claims.setdefault(event.task_id, []).append(payload["attempt"])
                resumes += event.type == "response.in_progress"

    assert {row.status for row in rows.values()} == {Status.COMPLETED.value}
    assert {task_id: texts[task_id] for task_id in words} == {
        task_id: expected_text(count) for task_id, count in words.items()}
    assert {task_id: claims[task_id] for task_id in words} == {
        task_id: list(range(1, rows[task_id].attempts + 1)) for task_id in words}
    assert resumes > 0  # the kills did hit work, and resumed some half-streamed
    for task_id in words:
        assert_log_sound(db, task_id)
