"""Store-level figures beside the raw commit rate of the same database, in one run.

Run from the repository root: `.venv/bin/python -m bench.store [--quick]`.
For each store (SQLite FULL, SQLite NORMAL, PostgreSQL) it prints:
- the raw rate of one small row per commit (sqlite3 / psycopg, no ORM): the ceiling;
- `enqueue` per second (task + response row + event + idempotency record, one commit);
- the same through `enqueue_many`, 16 requests per commit: the API's group commit when
  16 requests arrive together;
- claim + start + complete per second (claims in batches of 10, as a sweeper does);
- claims of one upstream task each per second (a stream's task claimed as it arrives);
- reads of one task per second (`get_response`: a read transaction, as `GET
  /v1/responses/{id}` makes);
then, on SQLite, `recover` of 100,000 leftover tasks and retention of 1,000,000
finished tasks with the longest write-lock hold of any batch.
The machine is shared and noisy: compare ratios within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy import insert

from core.engines.base import Usage
from core.idempotency import IdempotencyClaim
from core.ids import sortable_id
from core.models_registry import register_upstream
from core.settings import Settings, load_settings
from core.store import births, claims, completion, new_tasks, worker_writes
from core.store.connect import create_db_engine
from core.store.database import Database
from core.store.recovery import recover
from core.store.retention import remove_expired
from core.store.tasks import get_response
from core.tables import models, responses, task_events
from core.tables import tasks as tasks_table
from infra.migrate import upgrade
from tests.databases import private_pg_database

# Requests per commit in the group-commit figure: what the API's enqueuer gathers when
# 16 clients post at once (`handlers/enqueuing.py`, `enqueue_many`).
GROUP = 16


def rate(count: int, work: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(count):
        work(i)
    return count / (time.perf_counter() - start)


def raw_sqlite_rate(path: Path, synchronous: str, count: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, v TEXT)")

    def one(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO raw (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")

    result = rate(count, one)
    conn.close()
    return result


def raw_pg_rate(url: str, count: int) -> float:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw (id serial PRIMARY KEY, v text)")
        conn.commit()

        def one(i: int) -> None:
            conn.execute("INSERT INTO raw (v) VALUES (%s)", (f"row {i}",))
            conn.commit()

        return rate(count, one)


def prepared(url: str, **overrides: object) -> Database:
    settings = load_settings(database_url=url, **overrides)
    engine = create_db_engine(settings)
    upgrade(engine)
    db = Database(engine)
    with db.write() as conn:
        conn.execute(insert(models).values(id="m", engine="test.words", path="m.bin",
                                           size_bytes=1, sha256="0" * 64, created_at=0,
                                           metadata_json="{}"))
    return db


def store_rates(db: Database, count: int) -> dict[str, float]:
    request = json.dumps({"model": "m", "input": "hello"})

    def enqueue(i: int) -> None:
        new_tasks.enqueue(db, births.NewTask(client_id="bench", model="m", request_json=request),
                          idempotency=IdempotencyClaim(f"key-{i}", "digest"))

    enqueue_rate = rate(count, enqueue)

    def enqueue_group(i: int) -> None:
        new_tasks.enqueue_many(db, [
            (births.NewTask(client_id="bench", model="m", request_json=request),
             IdempotencyClaim(f"group-{i}-{n}", "digest")) for n in range(GROUP)])

    groups = max(1, count // GROUP)
    group_rate = rate(groups, enqueue_group) * GROUP
    start = time.perf_counter()
    done = 0
    while batch := claims.claim(db, limit=10, lease_ms=60_000, node_id="bench"):
        for claimed in batch:
            worker_writes.start_running(db, claimed.task_id, claimed.owner_token)
            completion.complete(db, claimed.task_id, claimed.owner_token, [], usage=Usage(1, 1))
            done += 1
    figures = {"enqueue_per_s": enqueue_rate, "group_enqueue_per_s": group_rate,
               "claim_finish_per_s": done / (time.perf_counter() - start),
               "upstream_claim_per_s": upstream_claim_rate(db, count)}
    task_id = new_tasks.enqueue(db, births.NewTask(client_id="bench", model="m",
                                                   request_json=request)).task_id
    return {**figures, "read_per_s": rate(count, lambda _: get_response(db, task_id, None))}


def upstream_claim_rate(db: Database, count: int) -> float:
    """Claims per second of one task of an upstream model each, local slots free too:
    how a sweeper claims streams that arrive one by one (the model's bound, its lock
    and the local pool's queries included). None of them finishes, so up to `count`
    attempts are in flight by the end, as under a hosted API's large bound: each claim
    counts them."""
    register_upstream(db, "up", base_urls=["http://127.0.0.1:9/v1"], model="up",
                      max_concurrency=4096)
    request = json.dumps({"model": "up", "input": "hello"})
    for first in range(0, count, GROUP):
        new_tasks.enqueue_many(db, [(births.NewTask(client_id="bench", model="up",
                                                    request_json=request), None)
                                    for _ in range(min(GROUP, count - first))])

    def claim(_: int) -> None:
        [_claimed] = claims.claim(db, limit=16, upstream_limit=1, lease_ms=60_000,
                                  node_id="bench")

    return rate(count, claim)


def rates_line(store: str, raw: float, figures: dict[str, float]) -> str:
    one, group = figures["enqueue_per_s"], figures["group_enqueue_per_s"]
    return (f"{store:13} raw commits/s {raw:7.0f} | enqueue/s {one:6.0f} ({one / raw:.2f} x raw)"
            f" | {GROUP} per commit {group:6.0f} ({group / raw:.2f} x raw)"
            f" | claim+finish/s {figures['claim_finish_per_s']:5.0f}"
            f" | upstream claims/s {figures['upstream_claim_per_s']:5.0f}"
            f" | task reads/s {figures['read_per_s']:5.0f}")


def bulk_tasks(db: Database, count: int, *, status: str, events_each: int,
               finished_at: int | None, chunk: int = 20_000) -> None:
    """Insert many tasks straight through Core, for recovery and retention runs."""
    start = db.clock.now_ms() - count  # one task per millisecond, ids in creation order
    for offset in range(0, count, chunk):
        ids = [sortable_id("resp", start + offset + n) for n in range(min(chunk, count - offset))]
        now = start + offset
        with db.write() as conn:
            conn.execute(insert(tasks_table), [
                {"id": i, "client_id": "bench", "model": "m", "status": status,
                 "on_restart": ("fail", "retry", "resume")[n % 3], "attempts": 1,
                 "max_attempts": 3, "created_at": now, "updated_at": now, "run_at": now,
                 "started_at": now, "finished_at": finished_at,
                 "owner_token": None if finished_at is not None else "x" * 32,
                 "lease_expires_at": None if finished_at is not None else now + 60_000,
                 "node_id": "bench", "last_seq": events_each, "dead_lettered": 0,
                 "metadata_json": "{}", "request_json": "{}"} for n, i in enumerate(ids)])
            conn.execute(insert(responses), [{"task_id": i, "output_text": "", "updated_at": now}
                                             for i in ids])
            conn.execute(insert(task_events), [
                {"task_id": i, "seq": s, "type": "response.created", "created_at": now,
                 "data": "{}"} for i in ids for s in range(1, events_each + 1)])


def recovery_seconds(db: Database, count: int) -> tuple[float, dict[str, int]]:
    bulk_tasks(db, count, status="running", events_each=3, finished_at=None)
    start = time.perf_counter()
    counts = recover(db, node_id=None)
    return time.perf_counter() - start, counts


def retention_figures(db: Database, count: int, batch_size: int) -> dict[str, float]:
    bulk_tasks(db, count, status="completed", events_each=3, finished_at=0)
    start = time.perf_counter()
    removed = remove_expired(db, retention_ms=1, batch_size=batch_size,
                             max_batches=10_000_000)
    return {"tasks": removed.tasks, "events": removed.events,
            "seconds": round(time.perf_counter() - start, 2), "batches": removed.batches,
            "longest_batch_ms": round(removed.longest_batch_ms, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = parser.parse_args()
    commits = 300 if args.quick else 2000
    leftovers = 10_000 if args.quick else 100_000
    finished = 20_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("FULL", "NORMAL"):
            raw = raw_sqlite_rate(Path(tmp) / f"raw-{synchronous}.db", synchronous, commits)
            db = prepared(f"sqlite:///{tmp}/store-{synchronous}.db",
                          sqlite_synchronous=synchronous)
            print(rates_line(f"sqlite {synchronous}", raw, store_rates(db, commits)))
            db.dispose()
        with private_pg_database() as url:
            raw = raw_pg_rate(url, commits)
            db = prepared(url)
            print(rates_line("postgresql", raw, store_rates(db, commits)))
            db.dispose()
        db = prepared(f"sqlite:///{tmp}/recover.db")
        seconds, counts = recovery_seconds(db, leftovers)
        print(f"sqlite recover of {leftovers} leftover running tasks: {seconds:.2f} s {counts}")
        db.dispose()
        db = prepared(f"sqlite:///{tmp}/retention.db")
        batch = Settings().retention_batch_size
        print(f"sqlite retention (batch {batch}): {retention_figures(db, finished, batch)}")
        db.dispose()


if __name__ == "__main__":
    main()
