"""`max_concurrency` holds across sweeper processes (both stores): two sweepers, twenty
tasks, a bound of 2 on a server with 4 slots: never more than 2 in flight, as the event
log's timestamps and the server's own `/slots` both show."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from sqlalchemy import select

from core.objects import TERMINAL_EVENTS
from core.settings import Settings
from core.store.database import Database
from core.tables import task_events
from tests.scheduler.processes import wait_until
from tests.store.helpers import task_row
from tests.upstream.helpers import add_upstream, enqueue
from tests.upstream.llama import LlamaServer
from tests.upstream.served import sweeper, upstream_env


def most_in_flight(db: Database, task_ids: list[str]) -> int:
    """The largest number of attempts between claim and end at one instant, from the
    log: `response.loading` opens an attempt, a terminal event closes it."""
    edges: list[tuple[int, int]] = []
    with db.read() as conn:
        for row in conn.execute(select(task_events.c.type, task_events.c.created_at)
                                .where(task_events.c.task_id.in_(task_ids))):
            if row.type == "response.loading":
                edges.append((row.created_at, 1))
            elif row.type in TERMINAL_EVENTS:
                edges.append((row.created_at, -1))
    level = peak = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
        level += step
        peak = max(peak, level)
    return peak


def test_two_sweepers_never_exceed_the_models_bound(
    db: Database, settings: Settings, tmp_path: Path, llamas: list[LlamaServer]
) -> None:
    server = LlamaServer(tmp_path / "llama", parallel=4).start()
    llamas.append(server)
    add_upstream(db, [server.base_url], max_concurrency=2)
    task_ids = enqueue(db, 20, max_output_tokens=6)
    env = upstream_env(settings.database_url, tmp_path)
    busy: list[int] = []
    done = threading.Event()

    def watch_slots() -> None:
        while not done.is_set():
            busy.append(server.busy_slots())
            done.wait(0.02)

    watcher = threading.Thread(target=watch_slots)
    watcher.start()
    children = [sweeper(env, tmp_path / f"sweeper-{n}.log") for n in range(2)]
    try:
        wait_until(lambda: all(task_row(db, t).status == "completed" for t in task_ids),
                   timeout=120, what="all twenty tasks to complete")
    finally:
        done.set()
        watcher.join()
        for child in children:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)

    assert most_in_flight(db, task_ids) == 2
    assert max(busy) <= 2 and len(busy) > 10
