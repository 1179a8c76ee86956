"""Sweeper pass time with many schedules due in the same minute, on both stores.

Run from the repository root:
`.venv/bin/python -m bench.schedules [--count N] [--repeat N] [--quick]`.
For each store (SQLite FULL, PostgreSQL) it prints, for 10,000 schedules due at once:
- the `fire_due` pass (claim, ledger, task, one transaction per chunk) at several chunk
  sizes, the default (`core.schedule_firing.CHUNK`) marked;
- the peers: the same number of tasks created in one transaction, nothing else, by
  `insert_tasks` in batches of the default chunk (the floor no firing strategy can beat,
  since every task is born there) and by `insert_task` one at a time (the old floor).
The target (issue #7) is a pass under 2 s on PostgreSQL. The machine is shared and
noisy: compare figures within one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from sqlalchemy import insert, select

from core import schedule_firing
from core.clock import Clock
from core.ids import sortable_id
from core.schedules import create_schedule
from core.settings import Settings
from core.store.births import NewTask, insert_task, insert_tasks
from core.store.connect import create_db_engine
from core.store.database import Database
from core.tables import models, schedules
from infra.migrate import upgrade
from scheduler.fire_schedules import fire_due
from tests.databases import private_pg_database

CREATED_AT = 1_767_225_600_000  # 2026-01-01T00:00Z: every schedule is made then
DUE_AT = CREATED_AT + 3_600_000 + 5_000  # 01:00:05, just after their common slot
REQUEST = {"model": "m", "input": "words=3", "metadata": {"source": "bench"}}


class FixedClock(Clock):
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


@contextmanager
def prepared(url: str, count: int) -> Iterator[tuple[Database, Settings]]:
    """A migrated store with one model and `count` copies of one hourly schedule."""
    settings = Settings(database_url=url)
    engine = create_db_engine(settings)
    upgrade(engine)
    db = Database(engine, FixedClock(CREATED_AT))
    with db.write() as conn:
        conn.execute(insert(models).values(id="m", engine="test.words", path="m.bin",
                                           size_bytes=1, sha256="0" * 64, created_at=0,
                                           metadata_json="{}"))
    first = create_schedule(db, settings, "bench", {"cron": "0 * * * *", "request": REQUEST})
    with db.read() as conn:
        found = conn.execute(select(schedules).where(schedules.c.id == first.id)).one()
    row = {column.key: found._mapping[column] for column in schedules.c}
    copies = [{**row, "id": sortable_id("sched", CREATED_AT)} for _ in range(count - 1)]
    if copies:
        with db.write() as conn:
            conn.execute(insert(schedules), copies)
    db.clock = FixedClock(DUE_AT)
    try:
        yield db, settings
    finally:
        db.dispose()


def pass_seconds(url: str, count: int, chunk: int) -> tuple[float, int]:
    with prepared(url, count) as (db, settings), mock.patch.object(schedule_firing, "CHUNK", chunk):
        start = time.perf_counter()
        created = fire_due(db, settings)
        return time.perf_counter() - start, created


def peer_seconds(url: str, count: int, batch: int) -> float:
    """`count` tasks in one transaction, nothing else: `insert_tasks` in batches of
    `batch`, or `insert_task` one at a time when `batch` is 1."""
    with prepared(url, 1) as (db, _settings):
        new = NewTask(client_id="bench", model="m", request_json=json.dumps(REQUEST))
        start = time.perf_counter()
        with db.write() as conn:
            for done in range(0, count, batch):
                if batch == 1:
                    insert_task(db, conn, new, DUE_AT)
                else:
                    insert_tasks(db, conn, [new] * min(batch, count - done), DUE_AT)
        return time.perf_counter() - start


def report(store: str, urls: Iterator[str], count: int, chunks: list[int],
           repeat: int) -> None:
    """Best of `repeat` runs of each figure (the machine is shared: noise only adds)."""
    for chunk in chunks:
        seconds, created = min(pass_seconds(next(urls), count, chunk) for _ in range(repeat))
        mark = " (default)" if chunk == schedule_firing.CHUNK else ""
        print(f"{store:10} fire_due, {count} schedules due, chunk {chunk:4}{mark:10}: "
              f"{seconds:6.2f} s  {created / seconds:7.0f} tasks/s  ({created} tasks)")
    for batch, how in ((schedule_firing.CHUNK, f"insert_tasks by {schedule_firing.CHUNK:<4}"),
                       (1, "insert_task one by one")):
        seconds = min(peer_seconds(next(urls), count, batch) for _ in range(repeat))
        print(f"{store:10} peer: {count} tasks, {how:22} in one transaction: "
              f"{seconds:6.2f} s  {count / seconds:7.0f} tasks/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1, help="report the best of N runs")
    parser.add_argument("--quick", action="store_true", help="only the default chunk size")
    args = parser.parse_args()
    chunks = [schedule_firing.CHUNK] if args.quick else [1, 50, schedule_firing.CHUNK, 1000]
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_urls = (f"sqlite:///{tmp}/schedules-{n}.db" for n in itertools.count())
        report("sqlite", sqlite_urls, args.count, chunks, args.repeat)

    def pg_urls() -> Iterator[str]:
        while True:
            with private_pg_database() as url:
                yield url

    report("postgresql", pg_urls(), args.count, chunks, args.repeat)


if __name__ == "__main__":
    main()
