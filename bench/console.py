"""The operator console's overview under a large store, beside `/metrics` in the same run.

Run from the repository root: `.venv/bin/python -m bench.console [--quick]`.
For SQLite and PostgreSQL it bulk-fills (SQLAlchemy Core inserts, 20,000 rows per
transaction) 1,000,000 finished tasks spread over the retention week (2 % failed, a
thousand of them dead letters, 1 % cancelled) and 100,000 queued ones (90 % due), then
renders `GET /console` for a logged-in admin through the ASGI test client and prints
p50/p95 in ms beside `GET /metrics`, which runs the same indexed counts without the
page, the chart and the session check. Then the page weight: the overview's and the
task list's HTML plus the console's stylesheet and script, in bytes.
The machine is shared and noisy: compare the two figures of one run, not across runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from litestar.testing import TestClient
from sqlalchemy import insert, text

from core.ids import sortable_id
from core.settings import Settings
from core.store.clients import create_client
from core.store.connect import create_db_engine
from core.store.database import Database
from core.tables import models, tasks
from handlers.console.render import ASSETS, asset_url
from infra.app import serving_app
from infra.migrate import upgrade
from tests.databases import private_pg_database

WEEK_MS = 7 * 24 * 3_600_000
CHUNK = 20_000
ROUNDS = 40


def fill(db: Database, finished: int, queued: int) -> float:
    """Bulk-insert the tasks; the seconds it took."""
    began = time.perf_counter()
    now = db.clock.now_ms()
    rng = random.Random(7)
    with db.write() as conn:
        conn.execute(insert(models).values(id="m", engine="test.words", path="m.bin",
                                           size_bytes=1, sha256="0" * 64, created_at=0,
                                           metadata_json="{}"))
    dead_left = 1000

    def finished_row(n: int) -> dict[str, Any]:
        nonlocal dead_left
        at = now - WEEK_MS + n * WEEK_MS // finished  # oldest first, ids in creation order
        roll = rng.random()
        status = "failed" if roll < 0.02 else "cancelled" if roll < 0.03 else "completed"
        dead = status == "failed" and dead_left > 0
        dead_left -= dead
        return _row(sortable_id("resp", at), at, status, finished_at=at + 1500,
                    dead_lettered=int(dead))

    def queued_row(n: int) -> dict[str, Any]:
        at = now - 600_000 + n * 600_000 // queued  # created over the last ten minutes
        run_at = at if rng.random() < 0.9 else now + 3_600_000
        return _row(sortable_id("resp", at), at, "queued", run_at=run_at)

    for count, make in ((finished, finished_row), (queued, queued_row)):
        _insert(db, count, make)
    with db.engine.connect() as conn:  # fresh statistics, as after any bulk load
        conn.execute(text("ANALYZE"))
        conn.commit()
    return time.perf_counter() - began


def _row(task_id: str, at: int, status: str, *, finished_at: int | None = None,
         run_at: int | None = None, dead_lettered: int = 0) -> dict[str, Any]:
    return {"id": task_id, "client_id": "cli_bench", "model": "m", "status": status,
            "on_restart": "retry", "attempts": 0 if status == "queued" else 1,
            "max_attempts": 3, "created_at": at, "updated_at": finished_at or at,
            "run_at": run_at or at, "started_at": None if status == "queued" else at,
            "finished_at": finished_at, "owner_token": None, "lease_expires_at": None,
            "node_id": None, "last_seq": 1, "dead_lettered": dead_lettered,
            "metadata_json": "{}", "request_json": '{"model":"m","input":"x"}'}


def _insert(db: Database, count: int, make: Callable[[int], dict[str, Any]]) -> None:
    for offset in range(0, count, CHUNK):
        with db.write() as conn:
            conn.execute(insert(tasks), [make(n) for n in range(offset,
                                                                min(count, offset + CHUNK))])


def timings_ms(http: TestClient[Any], path: str) -> tuple[float, float]:
    samples = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        answer = http.get(path, follow_redirects=False)
        samples.append((time.perf_counter() - began) * 1000)
        assert answer.status_code == 200, (path, answer.status_code)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def measure(url: str, finished: int, queued: int, label: str) -> None:
    settings = Settings(database_url=url)
    engine = create_db_engine(settings)
    upgrade(engine)
    db = Database(engine)
    seconds = fill(db, finished, queued)
    admin = create_client(db, name="bench", scopes=frozenset({"admin"}))
    with TestClient(serving_app(settings)) as http:
        assert http.post("/console/login", data={"token": admin.token},
                         follow_redirects=False).status_code == 303
        http.get("/console")  # warm: statement caches, templates
        console = timings_ms(http, "/console")
        metrics = timings_ms(http, "/metrics")
        weight = {"overview": len(http.get("/console").content),
                  "tasks": len(http.get("/console/tasks").content)}
        for name in ASSETS:
            weight[name] = len(http.get(asset_url(name)).content)
    db.dispose()
    print(f"{label:10} filled {finished:,} finished + {queued:,} queued in {seconds:.0f} s | "
          f"GET /console p50 {console[0]:.1f} ms p95 {console[1]:.1f} ms | "
          f"peer GET /metrics p50 {metrics[0]:.1f} ms p95 {metrics[1]:.1f} ms")
    print(f"{'':10} page weight {weight}: overview + assets "
          f"{weight['overview'] + sum(weight[n] for n in ASSETS):,} B, "
          f"tasks page + assets {weight['tasks'] + sum(weight[n] for n in ASSETS):,} B")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = parser.parse_args()
    finished, queued = (20_000, 2_000) if args.quick else (1_000_000, 100_000)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
          f"{os.getloadavg()[2]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        measure(f"sqlite:///{tmp}/console.db", finished, queued, "sqlite")
    with private_pg_database() as url:
        measure(url, finished, queued, "postgresql")


if __name__ == "__main__":
    main()
