"""Sweeper throughput and claim latency with real `taskward` processes, in one run.

Run from the repository root: `.venv/bin/python -m bench.throughput [--tasks N]`.

- Throughput: no-op tasks (the deterministic test engine, `words=1`) are committed in
  ONE transaction while 1 or 2 `taskward sweeper` processes wait; the figure is tasks
  per second from that commit until the last one is completed. SQLite and PostgreSQL.
- Latency: under `taskward run`, tasks are created one by one through
  `POST /v1/responses`; the figure is the time from the task's creation to its
  `response.loading` event (both stamped by the service clock), p50 and p99.

Beside them, the raw one-row commit rate of the same store in the same run (from
bench/store.py): the machine is shared and noisy, so compare ratios within a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select, text

import tests.engines  # noqa: F401  registers the `test.words` engine its model names
from bench.peer_systems import processes
from bench.store import raw_pg_rate, raw_sqlite_rate
from core.models_registry import register
from core.settings import Settings
from core.states import Status
from core.store.births import NewTask, insert_task
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from core.tables import task_events, tasks
from infra.migrate import upgrade
from tests.databases import private_pg_database
from tests.scheduler.processes import environment, free_port, wait_until

TASKWARD = str(Path(sys.executable).with_name("taskward"))
MODEL = "words"


@contextmanager
def store(kind: str, workdir: Path, **overrides: Any) -> Iterator[Settings]:
    """A fresh migrated database of `kind` with the test-engine model registered;
    settings for it, with `overrides`."""
    models_dir = workdir / "models"
    models_dir.mkdir(exist_ok=True)
    (models_dir / "words.bin").write_bytes(b"no-op model\n")
    if kind == "sqlite":
        urls: Iterator[str] = iter([f"sqlite:///{workdir / f'bench-{time.time_ns()}.db'}"])
        context = None
    else:
        context = private_pg_database()
        urls = iter([context.__enter__()])
    try:
        settings = Settings(database_url=next(urls), models_dir=models_dir, node_id="bench",
                            **overrides)
        db = Database(create_db_engine(settings))
        upgrade(db.engine)
        register(db, models_dir, "words.bin", model_id=MODEL, engine="test.words")
        db.dispose()
        yield settings
    finally:
        if context is not None:
            context.__exit__(None, None, None)


def enqueue_at_once(db: Database, count: int, *, analyze: bool = False) -> float:
    """Commit `count` no-op tasks in one transaction; returns the commit's end time.
    `analyze`: the planner's statistics are taken of them in that transaction (as
    `bench/peers.py` does before its drain), else they are as old as before."""
    request = json.dumps({"model": MODEL, "input": "words=1"})
    with db.write() as conn:
        now = db.clock.now_ms()
        for _ in range(count):
            new = NewTask(client_id="bench", model=MODEL, request_json=request)
            insert_task(db, conn, new, now)
        if analyze:
            conn.execute(text("ANALYZE"))
        db.announce_work(conn)
    return time.perf_counter()


def completed(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).where(
            tasks.c.status == Status.COMPLETED.value)).scalar_one())


def throughput(
    settings: Settings, sweepers: int, count: int, concurrency: int, logs: Path
) -> float:
    env = environment(settings, worker_concurrency=concurrency)
    commands = [([TASKWARD, "sweeper"], {**env, "TASKWARD_NODE_ID": f"bench-{i}"})
                for i in range(sweepers)]
    db = Database(create_db_engine(settings))
    try:
        with processes(commands, logs, "sweeper"):
            wait_until(lambda: all("sweeper started" in p.read_text()
                                   for p in logs.glob("sweeper-*.log")) and
                       len(list(logs.glob("sweeper-*.log"))) == sweepers,
                       timeout=60, what="sweepers up")
            start = enqueue_at_once(db, count)
            wait_until(lambda: completed(db) >= count, timeout=600, what="all completed")
            return count / (time.perf_counter() - start)
    finally:
        db.dispose()


def claim_latency(settings: Settings, count: int, logs: Path) -> tuple[float, float]:
    """p50 and p99 (ms) from creation to `response.loading` under `taskward run`."""
    port = free_port()
    db = Database(create_db_engine(settings))
    token = create_client(db, name="bench", scopes=frozenset({"admin"})).token
    try:
        with processes([([TASKWARD, "run", "--port", str(port)], environment(settings))], logs,
                       "run"):
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: _healthy(base), timeout=60, what="the API")
            ids = []
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
                for _ in range(count):
                    answer = http.post("/v1/responses", json={"model": MODEL, "input": "words=1"})
                    answer.raise_for_status()
                    ids.append(answer.json()["id"])
                    time.sleep(0.02)  # one at a time: latency, not a backlog
            wait_until(lambda: completed(db) >= count, timeout=120, what="all completed")
            with db.read() as conn:
                stamps: dict[str, dict[int, int]] = {}
                for row in conn.execute(select(task_events.c.task_id, task_events.c.seq,
                                               task_events.c.created_at)
                                        .where(task_events.c.seq <= 2)):
                    stamps.setdefault(row.task_id, {})[row.seq] = row.created_at
            latencies = sorted(s[2] - s[1] for s in stamps.values())
            return statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]
    finally:
        db.dispose()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def ceiling(settings: Settings, workdir: Path) -> float:
    if settings.is_sqlite:
        return raw_sqlite_rate(workdir / f"raw-{time.time_ns()}.db", "FULL", 2000)
    return raw_pg_rate(settings.database_url, 2000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16,
                        help="TASKWARD_WORKER_CONCURRENCY of each sweeper")
    parser.add_argument("--latency-tasks", type=int, default=300)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="taskward-bench-") as tmp:
        workdir = Path(tmp)
        for kind in args.stores.split(","):
            for sweepers in (1, 2):
                logs = workdir / f"logs-{kind}-{sweepers}"
                logs.mkdir()
                with store(kind, workdir) as settings:
                    raw = ceiling(settings, workdir)
                    rate = throughput(settings, sweepers, args.tasks, args.concurrency, logs)
                print(f"{kind:10} {sweepers} sweeper(s) x {args.concurrency} slots: "
                      f"{rate:8.0f} tasks/s   (raw one-row commits: {raw:6.0f}/s)", flush=True)
            logs = workdir / f"logs-{kind}-run"
            logs.mkdir()
            with store(kind, workdir) as settings:
                p50, p99 = claim_latency(settings, args.latency_tasks, logs)
            print(f"{kind:10} taskward run, enqueue -> response.loading: "
                  f"p50 {p50:.0f} ms, p99 {p99:.0f} ms", flush=True)


if __name__ == "__main__":
    main()
